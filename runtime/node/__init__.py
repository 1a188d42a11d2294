"""The job on its nodes: the entry every node runs (job.py) and its Ray (ray_bootstrap.py),
then on the head the placement group (placement.py) and the driver that builds the workers
and runs the loop (driver.py); torchrun.py is the same job as one torchrun world without Ray.
The top layer: it imports the others, nothing imports it. runtime/README.md has the layers."""
