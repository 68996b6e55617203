"""Servers that bench_gate.py starts as processes, and the client side that talks to them."""
