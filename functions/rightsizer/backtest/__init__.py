"""Backtest: price policies on history before turning them on (``rightsizer backtest``; never acts).

A leaf feature: ``model`` (the replayed history, the simulation model, the figures), ``simulate`` (the
replay through the same ``plan()`` the product runs, beside the baselines and the oracle), ``sources``
(an Alibaba GenAI trace, a directory of snapshots, Prometheus history), ``report`` (the request, the
sweep, text and JSON) and ``plot`` (extra ``[plot]``). Nothing in ``domain``, ``services``, ``adapters`` or
``wiring`` imports it, and the Lambda artifact leaves it out.
"""
