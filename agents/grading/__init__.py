"""Grading that what the agent left behind cannot steer: its changes captured as data (`changes`), the ones that
change how it is tested refused (`rules`), and the rest graded in a fresh box of the task (`fresh`)."""
