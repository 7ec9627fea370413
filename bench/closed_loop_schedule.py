"""What a loop that made given changes at given times would serve: a fixed schedule over a scenario's world.

``bench/closed_loop.py`` judges kvpilot's loop against static settings; this asks the questions between the
two: would the loop's own final settings have reached 0.95 had it switched sooner, or would a search that
never ran out of memory again have? Each change names the minute and the fields that change from the
settings before it (the scenario's plan first), rolled out as a surge, as the loop's are with a spare GPU;
``--from-serving`` counts the minutes from when the plan's pod first serves (the first evidence any loop
has). Prints the goodput (output tokens per second of completed requests), the minutes down, the OOMs and,
with ``--oracle TOK_S``, the ratio.

    python bench/closed_loop_schedule.py sglang-bad-new-settings \\
        5:max_running_requests=209,mem_fraction_static=0.836 \\
        7.5:max_running_requests=64,mem_fraction_static=0.84 \\
        15.5:max_running_requests=80 23.5:max_running_requests=95
    python bench/closed_loop_schedule.py sglang-slow-start --from-serving \\
        0.67:max_running_requests=206,mem_fraction_static=0.836
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.closed_loop import _fmt, _resolve  # noqa: E402
from bench.loopsim.scenario import BenchScenario, Settings  # noqa: E402
from bench.loopsim.world import DT, Stats, World  # noqa: E402


@dataclass(frozen=True)
class Change:
    minute: float
    fields: dict[str, object]


def parse_change(text: str) -> Change:
    """``MINUTE:field=value,field=value`` (``none``: unset, the engine's default)."""
    minute, _, rest = text.partition(":")
    fields: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        name, _, raw = item.partition("=")
        value: object
        if raw.lower() == "none":
            value = None
        else:
            try:
                value = int(raw)
            except ValueError:
                try:
                    value = float(raw)
                except ValueError:
                    value = raw
        fields[name.strip()] = value
    return Change(float(minute), fields)


def run_schedule(
    sc: BenchScenario, changes: list[Change], *, from_serving: bool = False
) -> tuple[Stats, Settings, float | None]:
    """The world under ``changes`` (surges), the last settings, and when the plan's pod first served (s)."""
    world = World(sc)
    settings: Settings = sc.start
    world.roll_out(settings, 0.0, strategy="surge")
    pending = sorted(changes, key=lambda c: c.minute)
    now, end, served = 0.0, sc.hours * 3600, None
    while now < end:
        now += DT
        world.step(now)
        if served is None and any(p.state == "serving" for p in world.pods):
            served = now
        origin = served if from_serving else 0.0
        while pending and origin is not None and now >= origin + pending[0].minute * 60 - 1e-6:
            settings = dataclasses.replace(settings, **pending.pop(0).fields)  # type: ignore[arg-type]
            world.roll_out(settings, now, strategy="surge")
    return world.stats, settings, served


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", help="a scenario file or name in bench/scenarios/")
    ap.add_argument("changes", nargs="*", help="MINUTE:field=value,... (from the settings before it)")
    ap.add_argument("--from-serving", action="store_true", help="minutes from the plan's pod first serving")
    ap.add_argument("--oracle", type=float, help="the oracle's goodput (tok/s), for the ratio")
    args = ap.parse_intermixed_args()
    (sc,) = _resolve([args.scenario])
    stats, final, served = run_schedule(
        sc, [parse_change(c) for c in args.changes], from_serving=args.from_serving
    )
    goodput = stats.output_tokens / (sc.hours * 3600)
    ratio = f" ({goodput / args.oracle:.3f} of the oracle)" if args.oracle else ""
    first = f"{served / 60:.1f}" if served is not None else "-"
    print(
        f"{sc.name}: {goodput:,.1f} tok/s{ratio}; down {stats.downtime_s / 60:.1f} min, {stats.ooms} OOMs, "
        f"the plan's pod first served at minute {first}; final {_fmt(final)}"
    )


if __name__ == "__main__":
    main()
