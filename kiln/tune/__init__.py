"""Autotuning against the machine model: knobs, search, evaluation and tuning records.

The cost model is exact (the schedule's makespan on the machine model) and
so is the checker (the simulator against the oracle), so tuning needs no
hardware. ``space`` says which stage options can vary, ``search`` walks
them, ``evaluate`` prices one candidate, ``records`` keeps the winners in
``tuning.jsonl``, which the compile tasks apply automatically.
"""
