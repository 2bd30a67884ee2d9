"""The scripts' tuning argument: KEY=V joined with + (e.g. SEESAW=1+READY_PARTS=2), over a tuning dict's keys."""


def parse(spec: str, known: dict) -> dict:
    """{KEY: int(V)} from spec; a key that `known` lacks raises SystemExit naming the known ones."""
    out = {}
    for item in filter(None, spec.split("+")):
        key, value = item.split("=")
        if key not in known:
            raise SystemExit(f"tuning key {key} is not one of {', '.join(known)}")
        out[key] = int(value)
    return out
