"""Secrets and tokens: ingest tokens per attempt and never stored or shown; API tokens hashed at rest (knox),
revocable and expiring."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command, load_command_class
from django.db import connection
from django.test import Client
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from runs.models import Run, RunStatus
from tests.runs.helpers import TEST_KIND
from tests.security.api_fixtures import (  # noqa: F401 (fixtures)
    _fast_password_hashing,
    _fresh_policy_cache,
    client_for,
    fresh_cache,
    handoffs,
    other_user,
    staff,
    user,
)

pytestmark = pytest.mark.django_db


def ingest(run_id: int, token: str, seq: int = 1):
    return APIClient().post(
        f"/api/runs/{run_id}/ingest/",
        [{"seq": seq, "type": "log"}],
        format="json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def failed_run(owner) -> Run:
    return Run.objects.create(
        name="r", origin="api", run_class="app", kind=TEST_KIND, owner=owner, status=RunStatus.FAILED
    )


def test_a_resume_gives_a_new_ingest_token_and_the_old_one_stops_at_once(user, handoffs):
    run = failed_run(user)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    old = Run.objects.get(pk=run.pk).ingest_token
    assert ingest(run.pk, old).status_code == 200
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)

    client = APIClient()
    client.force_authenticate(user)
    assert client.post(f"/api/runs/{run.pk}/resume/", {"from_scratch": True}, format="json").status_code == 200
    run.refresh_from_db()
    assert run.attempt == 1 and run.status in (RunStatus.QUEUED, RunStatus.STARTING)
    new = run.ingest_token
    assert new != old
    assert ingest(run.pk, old, seq=2).status_code == 401  # the previous attempt's job is cut off
    assert ingest(run.pk, new, seq=1).status_code == 200


def test_a_relaunch_of_the_same_attempt_keeps_its_token(user, settings, tmp_path):
    from runs.execution.ray import ingest_token_file_write  # what the launcher calls on every launch of the attempt

    settings.RUN_ARTIFACTS_DIR = tmp_path
    run = Run.objects.create(
        name="r", origin="api", run_class="app", kind=TEST_KIND, owner=user, status=RunStatus.RUNNING
    )
    first = ingest_token_file_write(Run.objects.get(pk=run.pk))
    content = first.read_text()
    again = ingest_token_file_write(Run.objects.get(pk=run.pk))  # e.g. a redelivered launch task
    assert (again, again.read_text()) == (first, content)
    assert first.stat().st_mode & 0o777 == 0o600
    assert ingest(run.pk, content).status_code == 200
    assert ingest(run.pk, content[:-1] + ("0" if content[-1] != "0" else "1")).status_code == 401


def test_ingest_tokens_are_not_stored(user):
    run = Run.objects.create(
        name="r", origin="api", run_class="app", kind=TEST_KIND, owner=user, status=RunStatus.RUNNING
    )
    token = run.ingest_token
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(r)::text FROM runs_run r WHERE id = %s", [run.pk])
        row = cursor.fetchone()[0]
    assert token not in row
    assert "ingest_token" not in row  # no column holds it, hashed or not: it is derived with SECRET_KEY
    assert ingest(run.pk, token).status_code == 200


def test_ingest_tokens_change_with_the_secret_key_and_fallbacks_keep_old_ones(user, settings):
    run = Run.objects.create(
        name="r", origin="api", run_class="app", kind=TEST_KIND, owner=user, status=RunStatus.RUNNING
    )
    token, old_key = run.ingest_token, settings.SECRET_KEY
    settings.SECRET_KEY = "x" * 60 + "rotated"
    assert ingest(run.pk, token).status_code == 401
    settings.SECRET_KEY_FALLBACKS = [old_key]  # a rotation keeps running jobs' tokens valid
    assert ingest(run.pk, token).status_code == 200


def test_admin_does_not_show_ingest_secrets(django_user_model):
    admin = django_user_model.objects.create_superuser("boss", password="pw-boss-long-enough")
    run = Run.objects.create(name="r", origin="api", run_class="app", kind=TEST_KIND, owner=admin)
    client = Client()
    client.force_login(admin)
    page = client.get(f"/admin/runs/run/{run.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "r" in text and run.ingest_token not in text and run.ingest_nonce not in text
    assert "ingest" not in text.lower()


def token_for(client: APIClient, username: str, password: str):
    return client.post("/api/auth/token/", {"username": username, "password": password}, format="json")


def test_api_token_revoke(user):
    key = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    client = APIClient(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200
    assert client.delete("/api/auth/token/").status_code == 204
    refused = client.get("/api/runs/")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Token"
    assert "revoked" in refused.json()["detail"]
    assert not AuthToken.objects.filter(user=user).exists()
    fresh = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    assert fresh != key


def test_api_token_revoke_deletes_only_the_presented_token(user):
    first = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    second = token_for(APIClient(), "alice", "pw-alice").json()["token"]  # a second script of the same user
    assert first != second
    assert APIClient(HTTP_AUTHORIZATION=f"Token {first}").delete("/api/auth/token/").status_code == 204
    assert APIClient(HTTP_AUTHORIZATION=f"Token {first}").get("/api/runs/").status_code == 401
    assert APIClient(HTTP_AUTHORIZATION=f"Token {second}").get("/api/runs/").status_code == 200


def test_api_token_revoke_by_session_and_anonymous(user):
    key = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    session = Client(enforce_csrf_checks=False)
    session.force_login(user)
    assert session.delete("/api/auth/token/").status_code == 204  # by a session: all the user's tokens
    assert not AuthToken.objects.filter(user=user).exists()
    assert APIClient(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 401
    assert APIClient().delete("/api/auth/token/").status_code in (401, 403)


def test_api_token_expires(user, settings):
    settings.API_TOKEN_MAX_AGE_SECONDS = 3600
    key = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    row = AuthToken.objects.get(user=user)
    assert row.expiry is not None and abs((row.expiry - row.created).total_seconds() - 3600) < 5
    client = APIClient(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/runs/").status_code == 200
    AuthToken.objects.filter(user=user).update(expiry=timezone.now() - timedelta(seconds=1))
    expired = client.get("/api/runs/")
    assert expired.status_code == 401, expired.content
    assert expired["WWW-Authenticate"] == "Token"
    assert "expired" in expired.json()["detail"]
    assert not AuthToken.objects.filter(user=user).exists()  # deleted when presented
    fresh = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    assert fresh != key
    assert APIClient(HTTP_AUTHORIZATION=f"Token {fresh}").get("/api/runs/").status_code == 200


def test_a_shorter_max_age_applies_at_once_to_older_tokens(user, settings):
    key = token_for(APIClient(), "alice", "pw-alice").json()["token"]  # issued under the 30-day default
    AuthToken.objects.filter(user=user).update(created=timezone.now() - timedelta(seconds=61))
    settings.API_TOKEN_MAX_AGE_SECONDS = 60
    expired = APIClient(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/")
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_expired_tokens_not_presented_are_deleted_on_the_next_post(user, settings):
    settings.API_TOKEN_MAX_AGE_SECONDS = 60
    key = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    AuthToken.objects.filter(user=user).update(created=timezone.now() - timedelta(seconds=61))
    fresh = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    assert fresh != key
    assert AuthToken.objects.filter(user=user).count() == 1
    assert APIClient(HTTP_AUTHORIZATION=f"Token {fresh}").get("/api/runs/").status_code == 200


def test_a_user_keeps_at_most_api_tokens_per_user(user, settings):
    settings.API_TOKENS_PER_USER = 3
    keys = [token_for(APIClient(), "alice", "pw-alice").json()["token"] for _ in range(5)]
    assert AuthToken.objects.filter(user=user).count() == 3
    answers = [APIClient(HTTP_AUTHORIZATION=f"Token {k}").get("/api/runs/").status_code for k in keys]
    assert answers == [401, 401, 200, 200, 200]  # the oldest went first


def test_the_database_holds_no_usable_token(user):
    key = token_for(APIClient(), "alice", "pw-alice").json()["token"]
    assert len(key) == 64
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(t)::text FROM knox_authtoken t")
        (row,) = (r for (r,) in cursor.fetchall())
    assert key not in row  # only a digest and the first 15 characters (the lookup key) are stored
    stored = AuthToken.objects.get(user=user)
    assert key.startswith(stored.token_key) and len(stored.token_key) == 15
    for copied in (stored.digest, stored.token_key, stored.digest[:64], stored.token_key + stored.digest[:49]):
        refused = APIClient(HTTP_AUTHORIZATION=f"Token {copied}").get("/api/runs/")
        assert refused.status_code == 401, copied
        assert refused["WWW-Authenticate"] == "Token"
    assert APIClient(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 200


@pytest.mark.parametrize(
    "header", ["Token", "Token a b", "Token \xff\xfe", "Token " + "f" * 10_000], ids=["bare", "two", "latin1", "long"]
)
def test_a_malformed_token_header_is_a_401(user, header):
    refused = APIClient(HTTP_AUTHORIZATION=header).get("/api/runs/")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Token"


def test_platform_admin_prints_a_valid_token(django_user_model, settings, capsys):
    settings.API_TOKEN_MAX_AGE_SECONDS = 60
    admin = django_user_model.objects.create_superuser("admin", password="pw-admin-long-enough")
    _row, old = AuthToken.objects.create(user=admin)
    AuthToken.objects.filter(user=admin).update(created=timezone.now() - timedelta(seconds=61))
    # The admin exists, so no password is used (passed only where this version of the command still asks).
    parser = load_command_class("runs", "platform_admin").create_parser("manage.py", "platform_admin")
    call_command("platform_admin", *(["--password", "unused"] if "--password" in parser.format_help() else []))
    key = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token"]
    assert key != old
    assert AuthToken.objects.filter(user=admin).count() == 1  # the expired one is gone
    assert APIClient(HTTP_AUTHORIZATION=f"Token {key}").get("/api/runs/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_migration_drops_the_plaintext_api_token_table():
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0010_run_redundant_indexes")])
    with connection.cursor() as cursor:  # what rest_framework.authtoken left: keys in clear
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp, user_id int)")
        cursor.execute("INSERT INTO authtoken_token VALUES ('plaintext-key', CURRENT_TIMESTAMP, 1)")
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES ('authtoken', '0001_initial', CURRENT_TIMESTAMP)"
        )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert "authtoken_token" not in connection.introspection.table_names()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_migrations WHERE app = 'authtoken'")
        assert cursor.fetchone()[0] == 0


@pytest.mark.django_db(transaction=True)
def test_migration_drops_stored_tokens_and_gives_each_run_its_own_nonce(django_user_model):
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0002_run_granted_at_index")])
    old_apps = executor.loader.project_state([("runs", "0002_run_granted_at_index")]).apps
    owner = django_user_model.objects.create_user("m")
    OldRun = old_apps.get_model("runs", "Run")
    for i in range(3):
        OldRun.objects.create(
            name=f"r{i}",
            origin="api",
            run_class="app",
            kind=TEST_KIND,
            owner_id=owner.pk,
            ingest_token=f"plaintext-{i}",
        )
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    nonces = list(Run.objects.values_list("ingest_nonce", flat=True))
    assert len(set(nonces)) == 3 and all(len(n) == 32 for n in nonces)
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(r)::text FROM runs_run r")
        assert not any("plaintext-" in row for (row,) in cursor.fetchall())


def test_serving_keys_are_per_attempt_not_stored_and_read_by_the_job(user, settings, tmp_path, monkeypatch):
    from runs.execution.ray import serving_key_file_write
    from trainer.serving_key import serving_key_from_env

    settings.RUN_ARTIFACTS_DIR = tmp_path
    run = Run.objects.create(
        name="r", origin="api", run_class="app", kind=TEST_KIND, owner=user, status=RunStatus.RUNNING
    )
    key = run.serving_keys()[0]
    assert key != run.ingest_token and len(key) == 64
    path = serving_key_file_write(run)
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("RLCP_SERVING_KEY_FILE", str(path))
    assert serving_key_from_env() == key
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(r)::text FROM runs_run r WHERE id = %s", [run.pk])
        assert key not in cursor.fetchone()[0]
    run.attempt += 1
    assert run.serving_keys()[0] != key  # a new attempt's job gets a new key
    run.attempt -= 1
    # After a SECRET_KEY rotation the proxy tries the new key first, then the one the running job holds.
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "another-secret-key-of-enough-length-0123456789-abcdefghijkl"
    keys = run.serving_keys()
    assert keys[0] != key and keys[1:] == [key]
