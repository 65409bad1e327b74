"""An Ollama Modelfile and the exact commands to create and run the model.

Default: ``FROM`` the merged GGUF. Creating a model from ``ADAPTER`` is reported to be dropped by
recent Ollama releases, and its safetensors adapters cover only Llama, Mistral and Gemma bases, so
``ADAPTER`` (base GGUF + adapter GGUF) is an option that says so.
"""

from __future__ import annotations

CHATML_TEMPLATE = (
    '{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}'
    '{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}'
    '<|im_start|>assistant\n'
)
ADAPTER_WARNING = ("ADAPTER: recent Ollama releases are reported to refuse creating models from an adapter, and "
                   "safetensors adapters only work on Llama, Mistral and Gemma bases; if `ollama create` fails, "
                   "use the default (FROM the merged GGUF).")


def modelfile(model_gguf: str, adapter_gguf: str | None, chat_template: str | None, system: str | None = None) -> str:
    lines = [f"FROM ./{model_gguf}"]
    if adapter_gguf:
        lines.append(f"ADAPTER ./{adapter_gguf}")
    if chat_template and "<|im_start|>" in chat_template:  # ChatML: Ollama needs it as a Go template
        lines.append(f'TEMPLATE """{CHATML_TEMPLATE}"""')
        lines.append('PARAMETER stop "<|im_end|>"')
    if system:
        lines.append(f'SYSTEM """{system}"""')
    lines.append("PARAMETER temperature 0")
    return "\n".join(lines) + "\n"


def commands(name: str) -> list[str]:
    return [f"ollama create {name} -f Modelfile", f"ollama run {name}"]
