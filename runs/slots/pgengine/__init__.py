"""Django's PostgreSQL backend with the grant lock's rollback rule (base.py): settings name it as the ENGINE."""
