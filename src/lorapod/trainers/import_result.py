"""What a trainer's ``import_config`` returns (``lorapod import``): the spec it means, and every
setting it had no word for, each with the reason, so nothing is dropped silently.

Apart from :mod:`lorapod.trainers.importer` (which finds the trainer a file belongs to, through the
registry) so that the trainer modules can build one without importing the registry back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from lorapod.spec import validate

NO_EQUIVALENT = "no lorapod equivalent"


@dataclass
class ImportResult:
    source: str  # axolotl | ai-toolkit | sd-scripts
    spec: dict[str, Any] = field(default_factory=dict)
    unmapped: list[tuple[str, str]] = field(default_factory=list)

    def put(self, dotted: str, value: Any) -> None:
        if dotted == "train.max_grad_norm" and value is not None and not 0 < float(value) < float("inf"):
            value = None  # 0 (kohya, transformers) and infinity (ai-toolkit) clip nothing: lorapod's null
        node = self.spec
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value

    def skip(self, key: str, why: str = NO_EQUIVALENT) -> None:
        self.unmapped.append((key, why))

    def to_yaml(self) -> str:
        validate(self.spec)  # the result is a valid spec, or a SpecError naming the key
        return f"# imported from a {self.source} config by `lorapod import`\n" + yaml.safe_dump(self.spec, sort_keys=False)


# the schedulers lorapod has, by the name all three trainers give them
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
