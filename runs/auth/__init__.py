"""Who may call: API tokens, sign-in limits, and the derived secrets of a run's attempt."""
