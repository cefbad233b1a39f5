"""The off-policy stability benchmark: ``python -m sorl_verl.stability`` (and ``make stability``).

A sweep of off-policy pressure x method x seed through verl's real trainer, one quick-start run
(``examples/quickstart/run_demo.sh``) per cell, from one warm start per seed. :mod:`.grid` is
the grid and each run's settings, :mod:`.sweep` runs it (skip, resume, progress), :mod:`.analysis`
turns finished runs into the table and figures, :mod:`.cli` is the command line.
See docs/stability.md.
"""

from sorl_verl.stability.grid import METHODS, PRESSURES, Budget, Pressure, RunSpec, build_grid

__all__ = ["METHODS", "PRESSURES", "Budget", "Pressure", "RunSpec", "build_grid"]
