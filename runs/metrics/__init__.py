"""Where Prometheus metrics are recorded (docs/observability.md, section "Metrics"): their declarations
(`spec`), the Redis-backed counters and histograms every process records into (`record`) and the recording
points (`hooks`). A leaf: it imports nothing else of runs, so any layer may record. What a scrape reads (the
collector, per-run histograms, agent families) is runs/telemetry/prometheus/."""
