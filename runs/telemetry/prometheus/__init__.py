"""The /metrics exposition: the collector, per-run histograms and agent families."""
