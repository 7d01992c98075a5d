"""Prometheus metrics of the platform (docs/observability.md, section "Metrics"): their declarations
(`spec`), the Redis-backed counters and histograms every process records into (`record`), the per-run
histograms folded into run summaries at ingest (`run_hist`), and the collector that builds the exposition at
scrape time from Redis and the database (`collector`)."""
