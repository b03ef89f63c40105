"""The command-line interfaces, `coreopt` and `tcast`: thin layers over the library.

OpenMP threads that wait by spinning burn the CPU another process needs: on 2 busy cores an eval
took 2.3x the CPU time and twice the wall time it takes with waiting threads asleep, which costs
~2% on a quiet machine (docs/benchmarks.md). So the commands let them sleep. It is set here, when
the package is first imported - before a plugin (loaded as the app is built) or a command imports
torch, whose OpenMP reads it once - and a user's own setting wins.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
