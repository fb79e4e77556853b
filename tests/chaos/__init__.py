"""Fault-injection tests: real servers, real worker processes, an append-only event log per
process and a Jepsen-style checker that judges every run (see ``checker.py``)."""
