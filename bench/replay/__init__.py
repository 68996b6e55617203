"""Agent-shaped sessions: recorded from real agents (record.py), replayed at scale against each target (bench_replay.py)."""
