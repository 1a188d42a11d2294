"""Below every other part of the runtime, importing none of them: the slices a component gets
(slices.py), the backend interfaces (interfaces.py), the maths the loop and the backends both
compute (algorithm.py, nucleus.py, loss_head.py, weights.py), and how a set of hosts is called
(hosts.py, spmd.py). runtime/README.md has the layers."""
