"""Assessing a population: evaluation on fresh envs, distinct solutions and KL diagnostics.

- :mod:`myriad.assess.evaluation`: batched evaluation rollouts of every member, per-member
  scores, and the finetuning runner's :class:`~myriad.assess.evaluation.PopulationEvaluator`
  (the leader's and the best member's success, distinct solutions, robustness).
- :mod:`myriad.assess.solutions`: the distinct-solutions rule (regions of a layout, episode
  signatures, clusters).
- :mod:`myriad.assess.diagnostics`: exact Gaussian KLs between a leader and its followers on the
  latest rollout.

These measure a population; they train nothing, so the algorithms (:mod:`myriad.finetune`), the
tools and the figures (:mod:`myriad.viz`) all use them.
"""
