"""sorl-verl: SORL / ST-PPO algorithms and Search-R1 pipelines, registered into verl.

Importing this package registers nothing by itself: registration happens in
:mod:`sorl_verl.plugin`, which verl imports through the ``verl.plugins`` entry point.
"""

__version__ = "0.1.0"
