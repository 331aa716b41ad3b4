"""Input-grounded chat prompts for the speculative-decoding benchmark: the answer quotes or edits
the prompt (rename a variable in a function, copy the sentences about someone, turn a record
into JSON). Every call with a different seed gives different prompts, so no system or point
sees another's prompts (and the prefix cache cannot help across them)."""

from __future__ import annotations

import random

WORDS = [
    "amber",
    "basin",
    "cedar",
    "delta",
    "ember",
    "falcon",
    "garnet",
    "harbor",
    "island",
    "juniper",
    "kestrel",
    "lantern",
    "meadow",
    "nickel",
    "orchard",
    "pepper",
    "quartz",
    "raven",
    "saddle",
    "timber",
    "umber",
    "velvet",
    "willow",
    "yarrow",
    "zephyr",
    "anchor",
    "bramble",
    "copper",
    "dune",
    "fennel",
    "glacier",
    "hazel",
    "indigo",
    "jasper",
    "kelp",
    "lichen",
    "marble",
    "nectar",
    "onyx",
    "pebble",
    "quill",
    "reed",
    "sorrel",
    "thistle",
]
NAMES = [
    "Alice",
    "Bruno",
    "Chen",
    "Dalia",
    "Emeka",
    "Farah",
    "Goran",
    "Hana",
    "Ivo",
    "Jamal",
    "Kira",
    "Lars",
    "Mei",
    "Nadia",
]
CITIES = [
    "Lisbon",
    "Oslo",
    "Kyoto",
    "Lima",
    "Accra",
    "Perth",
    "Quebec",
    "Tunis",
    "Hanoi",
    "Zagreb",
    "Cusco",
    "Malmo",
]
ITEMS = [
    "lanterns",
    "maps",
    "postcards",
    "ropes",
    "compasses",
    "kettles",
    "blankets",
    "candles",
    "charts",
]


def _code(rng: random.Random) -> str:
    fn, a, b, total, extra, limit = (rng.choice(WORDS) for _ in range(6))
    a, b = f"{a}_count", f"{b}_rate"
    n1, n2, n3 = rng.randint(2, 9), rng.randint(10, 99), rng.randint(100, 999)
    body = f"""def {fn}_summary({a}, {b}):
    {total} = {a} * {b} + {n1}
    {extra}_{limit} = []
    for index in range({a}):
        if index % {n1} == 0:
            {extra}_{limit}.append(index * {b})
    if {total} > {n3}:
        {total} = {total} - {n2}
    return {total}, {extra}_{limit}
"""
    new = f"{rng.choice(WORDS)}_value"
    return (
        f"Rename the variable `{total}` to `{new}` in this Python function. "
        f"Output the complete function.\n\n```python\n{body}```"
    )


def _people(rng: random.Random) -> str:
    people = rng.sample(NAMES, 4)
    lines = []
    for name in people:
        city, item = rng.choice(CITIES), rng.choice(ITEMS)
        age, count = rng.randint(20, 70), rng.randint(2, 40)
        lines.append(
            f"{name} is {age} years old and lives in {city}, where {name} sells {count} {item} "
            f"every week at the harbour market."
        )
    target = rng.choice(people[1:])
    return (
        "Here is a text:\n\n" + " ".join(lines) + f"\n\nCopy, word for word, the sentence about "
        f"{target}. Then copy the sentence about {people[0]}."
    )


def _record(rng: random.Random) -> str:
    name, city, item = rng.choice(NAMES), rng.choice(CITIES), rng.choice(ITEMS)
    order = rng.randint(1000, 9999)
    return (
        f"Order {order} was placed by {name} from {city} for {rng.randint(2, 30)} {item} "
        f"at {rng.randint(3, 90)} euros each, shipped on day {rng.randint(1, 28)} of month "
        f"{rng.randint(1, 12)}.\n\nWrite this order as a JSON object with the keys order, "
        "name, city, quantity, item, price and shipped, then repeat the original sentence."
    )


def prompts(seed: int, count: int) -> list[list[dict[str, str]]]:
    """`count` chat conversations (one user message each), reproducible from `seed`."""
    rng = random.Random(seed)
    makers = (_code, _people, _record)
    return [[{"role": "user", "content": makers[i % 3](rng)}] for i in range(count)]
