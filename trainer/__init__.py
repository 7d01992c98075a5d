"""Django-free RL trainer: tasks, policy, engines, workers, algorithm, sampler, checkpoints, job loop."""
