"""Per-trial fixed overhead, before and after sharing worker groups: the same sweep run with a fresh
Ray Train worker group per grid point (`sweep.points_per_worker_group=1`, the old design) and with
one worker group for the whole grid (the default), one after the other. Prints `name: value` lines;
the last line is the headline (the grouped sweep's wall time over its trials' own time; goal <= 1.5).

    python scripts/bench_startup.py [--out .sweeper/bench_startup] [-- extra Hydra overrides]
"""

from __future__ import annotations

from _sweeps import parser, read_sweep, run_sweep, spread, start

DEFAULT = ["+experiment=resnet_batch"]


def main() -> None:
    out, overrides = start(parser(__doc__, ".sweeper/bench_startup", DEFAULT).parse_args(), DEFAULT)

    figures = {}
    for name, group in (("per_point", "1"), ("grouped", "null")):
        folder = out / name
        command_wall = run_sweep(folder, [*overrides, f"sweep.points_per_worker_group={group}"])
        parent, children = read_sweep(folder)
        ok = [c for c in children if c["status"] == "ok"]
        group_startup = [c["worker_group_startup_seconds"] for c in ok if "worker_group_startup_seconds" in c]
        point_startup = [c["startup_seconds"] for c in ok]
        # What each point pays before its first optimizer step, the group's start-up shared out.
        amortized = (sum(group_startup) + sum(point_startup)) / len(ok)
        figures[name] = parent
        print(f"{name}_trials_ok: {len(ok)} of {len(children)}")
        print(f"{name}_worker_groups: {len(group_startup)}")
        print(f"{name}_worker_group_startup_seconds: {spread(group_startup)}")
        # Where a group's start-up goes: Ray Train's actors up to the worker process, the process's
        # imports and process group, the group's own setup (data, peak FLOP/s).
        for part in ("launch", "init", "setup"):
            values = [c[f"worker_group_{part}_seconds"] for c in ok if f"worker_group_{part}_seconds" in c]
            print(f"{name}_worker_group_{part}_seconds: {spread(values)}")
        gaps = [c["between_points_seconds"] for c in ok if "between_points_seconds" in c]
        print(f"{name}_between_points_seconds: {spread(gaps)}")
        print(f"{name}_point_startup_seconds: {spread(point_startup)}")
        print(f"{name}_startup_seconds_per_point_amortized: {amortized:.2f}")
        print(f"{name}_sum_trial_seconds: {parent['sum_trial_seconds']:.1f}")
        print(f"{name}_sweep_wall_seconds: {parent['sweep_wall_seconds']:.1f} (command {command_wall:.1f})")
        phases = ("setup", "ray_start", "tracking", "grid", "report")
        print(f"{name}_sweep_phases_seconds: " + ", ".join(f"{p} {parent[f'sweep_{p}_seconds']:.1f}" for p in phases))
        print(f"{name}_sweep_wall_over_trial_seconds: {parent['sweep_wall_over_trial_seconds']:.2f}")
        print(f"{name}_sweep_wall_over_train_seconds: {parent['sweep_wall_over_train_seconds']:.2f}")
    speedup = figures["per_point"]["sweep_wall_seconds"] / figures["grouped"]["sweep_wall_seconds"]
    print(f"sweep_wall_speedup_grouped_over_per_point: {speedup:.2f}")
    print(f"grouped_sweep_wall_over_trial_seconds: {figures['grouped']['sweep_wall_over_trial_seconds']:.2f}")


if __name__ == "__main__":
    main()
