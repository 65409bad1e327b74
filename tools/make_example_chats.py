"""Write examples/data/chats.jsonl: 1,500 chat examples (messages format) for examples/llm-chat-lora.yaml.

Every answer is computed here (unit conversions, arithmetic, percentages, counting, sorting, dates),
so the file is correct by construction, reproducible (fixed seed) and free of anyone else's text:
it shows the format and gives ``plan``, ``data check`` and ``train`` a real file to read. It teaches
a terse, worked-answer style, not knowledge; train on your own chats for anything real.

    python tools/make_example_chats.py            # rewrites examples/data/chats.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "examples" / "data" / "chats.jsonl"
SYSTEM = "You are a precise assistant. Show the one step that matters, then the answer."
WORDS = ["lantern", "harbour", "pepper", "orbit", "meadow", "crystal", "banana", "kettle", "saddle", "lemonade",
         "mississippi", "bookkeeper", "parallel", "committee", "balloon", "window", "pebble", "garden"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def _num(x: float) -> str:
    return f"{x:,.2f}".rstrip("0").rstrip(".")


def km_miles(r: random.Random) -> tuple[str, str]:
    km = r.randint(1, 500)
    return (r.choice([f"How many miles is {km} km?", f"Convert {km} kilometres to miles.", f"{km} km in miles?"]),
            f"1 km is 0.621371 miles, so {km} km x 0.621371 = {_num(km * 0.621371)} miles.")


def celsius(r: random.Random) -> tuple[str, str]:
    c = r.randint(-30, 45)
    return (r.choice([f"What is {c} °C in Fahrenheit?", f"Convert {c} degrees Celsius to Fahrenheit."]),
            f"°F = °C x 9/5 + 32 = {c} x 1.8 + 32 = {_num(c * 1.8 + 32)} °F.")


def kilograms(r: random.Random) -> tuple[str, str]:
    kg = r.randint(1, 150)
    return (r.choice([f"How many pounds is {kg} kg?", f"Convert {kg} kg to pounds."]),
            f"1 kg is 2.20462 lb, so {kg} kg x 2.20462 = {_num(kg * 2.20462)} lb.")


def arithmetic(r: random.Random) -> tuple[str, str]:
    a, b = r.randint(12, 999), r.randint(12, 999)
    if r.random() < 0.5:
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    return f"What is {a} times {b}?", f"{a} x {b} = {a * b}."


def percent(r: random.Random) -> tuple[str, str]:
    p, x = r.choice([5, 10, 12.5, 15, 20, 25, 30, 40, 75]), r.randint(20, 2000)
    return (f"What is {_num(p)}% of {x}?", f"{_num(p)}% is {_num(p / 100)}, and {_num(p / 100)} x {x} = {_num(p * x / 100)}.")


def letters(r: random.Random) -> tuple[str, str]:
    w = r.choice(WORDS)
    ch = r.choice(sorted(set(w)))
    n = w.count(ch)
    return (f"How many times does the letter '{ch}' appear in \"{w}\"?",
            f"Spelled out: {'-'.join(w)}. The letter '{ch}' appears {n} time{'s' if n != 1 else ''}.")


def sorting(r: random.Random) -> tuple[str, str]:
    xs = r.sample(range(1, 100), r.randint(4, 8))
    return (f"Sort these numbers from smallest to largest: {', '.join(map(str, xs))}.",
            f"In order: {', '.join(map(str, sorted(xs)))}.")


def weekday(r: random.Random) -> tuple[str, str]:
    d, n = r.randrange(7), r.randint(2, 60)
    return (f"If today is {DAYS[d]}, what day is it in {n} days?",
            f"{n} days is {n // 7} week{'s' if n // 7 != 1 else ''} and {n % 7} day{'s' if n % 7 != 1 else ''}; "
            f"{n % 7} day{'s' if n % 7 != 1 else ''} after {DAYS[d]} is {DAYS[(d + n) % 7]}.")


TASKS = [km_miles, celsius, kilograms, arithmetic, percent, letters, sorting, weekday]


def build(n: int = 1500, seed: int = 38) -> list[dict]:
    r = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        turns = 2 if r.random() < 0.15 else 1  # some two-turn chats: every reply is a training target
        msgs = [{"role": "system", "content": SYSTEM}] if r.random() < 0.5 else []
        for _ in range(turns):
            q, a = r.choice(TASKS)(r)
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        key = json.dumps(msgs)
        if key not in seen:  # `lorapod data check` flags duplicates: none here
            seen.add(key)
            out.append({"messages": msgs})
    return out


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in build()), encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
