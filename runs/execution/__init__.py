"""Execution of runs: the kinds a run can be (`kinds`, each with a pure `job_spec`), their submission
(`submit`), the one launcher that submits and stops every kind's job on Ray (`launch`, `ray`), the tick's
reconcile of runs against their jobs (`reconcile`), how a job's outcome finishes a run (`outcome`), and what
follows a finished run (`followups`). It builds on runs.core.lifecycle and runs.scheduling.enqueue; nothing below
imports it."""
