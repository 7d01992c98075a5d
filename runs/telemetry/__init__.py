"""What runs report and how the platform shows it: ingest, real-time, board, samples, trace, metrics."""
