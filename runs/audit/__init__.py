"""The append-only audit log: who changed what (runs/audit/models.py), written by each change's single writer in
its own transaction (runs/audit/record.py), with the request id of the call (runs/audit/request_id.py)."""
