"""The captured samples of runs (`sample` events), in a table of their own. Re-exported by runs.models."""

from __future__ import annotations

from django.db import models


class Sample(models.Model):
    """One captured episode of a run (a `sample` event, trainer/sample_schema.py), in its own table so the
    inspector filters it by index and the run summary never carries it. The filtered fields are columns; the
    turns and reward parts stay in `data`. (run, source, source_seq) makes a re-posted event a no-op."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="samples")
    source = models.CharField(max_length=32)
    source_seq = models.BigIntegerField()
    ts = models.DateTimeField()
    step = models.IntegerField()
    group = models.BigIntegerField()
    index = models.IntegerField()
    prompt_index = models.IntegerField()
    session = models.CharField(max_length=200)
    engine = models.CharField(max_length=200)
    finish_reason = models.CharField(max_length=8)
    pick = models.CharField(max_length=8)
    reward = models.FloatField()
    advantage = models.FloatField()
    version_min = models.IntegerField()
    version_max = models.IntegerField()
    staleness = models.IntegerField()
    length = models.IntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    data = models.JSONField(default=dict)  # {"turns": [...], "reward_parts": {...}}

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "source", "source_seq"], name="sample_source_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["run", "id"], name="sample_run_id_idx"),
            models.Index(fields=["run", "step", "id"], name="sample_run_step_idx"),
            models.Index(fields=["run", "reward", "id"], name="sample_run_reward_idx"),
            models.Index(fields=["run", "advantage", "id"], name="sample_run_advantage_idx"),
            models.Index(fields=["run", "length", "id"], name="sample_run_length_idx"),
            models.Index(fields=["run", "finish_reason", "staleness", "id"], name="sample_run_finish_idx"),
            models.Index(fields=["run", "group", "index"], name="sample_run_group_idx"),
            models.Index(fields=["run", "prompt_index", "step"], name="sample_run_prompt_idx"),
            models.Index(fields=["run", "engine", "id"], name="sample_run_engine_idx"),
        ]
