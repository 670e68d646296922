"""sweep.strategy: how the points of a sweep are chosen. Each strategy decides here, in one pure module
(standard library and sweeper's config, plan and schema; no torch, Ray or MLflow; tested without
processes), behind one interface (base.py: `Strategy`); what runs its points on Ray, records them and
says so on the console is its driver side, sweeper/driver/<name>.py. This package never imports the
driver.

- base.py: `Strategy` (what the train sweep asks before any point runs), `Measured` (what running gives).
- grid.py: every point measured as itself, in worker groups, in rounds until each is recorded
  (the grid's arithmetic: sweeper/plan.py).
- smart.py: accuracy classes, the rungs of successive halving, each point's record composed from its
  measurement runs, the compute ledger.
- branch.py: the trunk and its branches, the schedule, the answer; branch_reading.py: the local critical
  batch size read at one checkpoint.
"""
