"""sweep.strategy: how the points of a sweep are chosen. Each strategy is its pure rules (standard
library, tested on fixed curves) and its driver side, which runs what the rules decide on Ray:

- grid: every point of the grid (the arithmetic: sweeper/plan.py; the run: driver/train_sweep.py measure_grid).
- smart: smart.py (accuracy classes, rungs, the ledger), smart_driver.py.
- branch: branch.py (the local critical batch size, the schedule), branch_driver.py.
"""
