"""Measuring whether a policy learns: task families with disjoint training and held-out splits
(`families`), and the held-out success rate of a checkpoint with its 95% interval (`evaluate`)."""
