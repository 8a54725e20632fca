"""Pure decision code: models, policy, metric interpretation, pod filters, verdicts and the planner."""
