"""The shared fixtures work: a real Ray cluster that runs a job, and Redis."""

import time

from ray.job_submission import JobStatus, JobSubmissionClient


def test_ray_cluster_runs_a_job(ray_cluster):
    client = JobSubmissionClient(ray_cluster.dashboard_url)
    job = client.submit_job(entrypoint="python -c 'import ray, torch; print(\"ok\")'")
    deadline = time.monotonic() + 90
    while client.get_job_status(job) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        assert time.monotonic() < deadline, "job did not finish"
        time.sleep(0.5)
    assert client.get_job_status(job) == JobStatus.SUCCEEDED, client.get_job_logs(job)


def test_redis_is_reachable(redis_url):
    import redis

    assert redis.Redis.from_url(redis_url).ping()
