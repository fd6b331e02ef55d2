"""Hand-over links and temporary credentials (issue 51, item 2): the controller knows when its
credentials end (botocore's RefreshableCredentials), signs the URLs for no longer, says so at launch
when they end before the run's limit, renews them on its heartbeat; the agent takes the renewed ones
and signs a refused URL again with the instance role (wire/handover_urls.py); the sandbox's S3
refuses a URL past its end (sandbox/presigned.py). The sandbox end to end:
tests/e2e/test_handover_credentials_e2e.py."""
import http.server
import json
import os
import threading
import time
import urllib.parse
from datetime import datetime, timedelta, timezone

import boto3
import botocore.config
import pytest

from ec2gpu.agent import agent
from ec2gpu.aws import iam, runstore_objects
from ec2gpu.aws.session import Aws
from ec2gpu.errors import UsageError
from ec2gpu.runs.recover import handover
from ec2gpu.sandbox import presigned
from ec2gpu.wire import bounded_json, handover_urls

BUCKET = "ec2gpu-123456789012-us-east-1"
USER, RUN = "AIDAEXAMPLE", "20260101-000000-abcd"
KEYS = {"outputs": f"runs/{USER}/{RUN}/handover/outputs.tar.gz", "record": f"runs/{USER}/{RUN}/handover/agent-record.json"}


def _s3(key_id="AKIAEXAMPLE", endpoint=None):
    return boto3.client("s3", region_name="us-east-1", aws_access_key_id=key_id, aws_secret_access_key="secret",
                        endpoint_url=endpoint, config=botocore.config.Config(signature_version="s3v4"))


def _query(url):
    return {k: v[0] for k, v in urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).items()}


class _Aws:
    """What handover.sign asks of an Aws: its credentials' end (``ends``: a datetime or None) and an S3 client."""

    def __init__(self, ends, key_id="AKIAEXAMPLE"):
        self.ends, self.s3 = ends, _s3(key_id)

    def credentials_expire_at(self):
        return self.ends

    def client(self, service):
        return self.s3


# --- the controller ---------------------------------------------------------------------------

def test_the_controller_reads_when_temporary_credentials_end_and_none_for_keys_that_do_not(monkeypatch, tmp_path):
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ASIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    # botocore's EnvProvider makes RefreshableCredentials of keys with AWS_CREDENTIAL_EXPIRATION (credentials.py)
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", "2099-01-02T03:04:05Z")
    assert Aws("us-east-1").credentials_expire_at() == datetime(2099, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    monkeypatch.delenv("AWS_CREDENTIAL_EXPIRATION")
    assert Aws("us-east-1").credentials_expire_at() is None  # keys with no end known
    assert Aws("us-east-1", credentials=("AKIA", "s", None)).credentials_expire_at() is None  # the sandbox's


def test_urls_last_no_longer_than_the_credentials_that_sign_them():
    now = time.time()
    capped = runstore_objects.presign_puts(_s3(), BUCKET, KEYS, 7200, credentials_end=now + 600, now=now)
    assert {int(_query(u)["X-Amz-Expires"]) for u in capped.values()} == {600}
    assert {int(_query(u)["X-Amz-Expires"]) for u in runstore_objects.presign_puts(_s3(), BUCKET, KEYS, 7200).values()} \
        == {7200}  # an IAM user's keys: what was asked
    assert runstore_objects.presign_seconds(30 * 86400, None, now) == runstore_objects.PRESIGN_MAX_S
    assert runstore_objects.presign_seconds(3600, now - 5, now) == 1  # ended: as short as S3 allows


def test_sign_caps_the_urls_at_the_credentials_end_and_says_when_they_stop_working():
    now = time.time()
    plan = handover.Handover(BUCKET, {}, 300, KEYS, None, now + 5 * 3600)
    aws = _Aws(datetime.fromtimestamp(now + 3000, timezone.utc))
    signed = handover.sign(aws, aws.s3, plan, now)
    assert signed.expires_at == pytest.approx(now + 3000, abs=1) and set(signed.urls) == set(KEYS)
    assert all(int(_query(u)["X-Amz-Expires"]) <= 3000 for u in signed.urls.values())
    lasting = handover.sign(_Aws(None), aws.s3, plan, now)  # keys that do not end: the run's limit
    assert lasting.expires_at == pytest.approx(now + 5 * 3600, abs=1)


def test_a_launch_whose_credentials_end_before_the_runs_limit_says_so_in_one_line():
    now = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc).timestamp()
    said = handover.expiry_warning(now + 3600, now + 2 * 3600, now)
    assert said is not None and "\n" not in said and said.startswith("warning: these AWS credentials expire at 13:00 UTC")
    assert "14:00 UTC" in said and "(in 60 min)" in said and "keep this command running" in said
    assert "no --max-runtime" in handover.expiry_warning(now + 3600, None, now)
    assert handover.expiry_warning(now + 3 * 3600, now + 2 * 3600, now) is None  # they outlast the run
    assert handover.expiry_warning(None, None, now) is None  # an IAM user's keys


def test_prepare_warns_at_launch_when_the_credentials_end_before_the_limit(monkeypatch):
    now = time.time()
    monkeypatch.setattr(handover.runstore, "ensure", lambda *a, **k: BUCKET)

    class Aws_(_Aws):
        region = "us-east-1"

        def check_credentials(self):
            return {"Account": "123456789012", "UserId": USER, "Arn": "arn:aws:sts::123456789012:assumed-role/r/s"}

    settings = type("S", (), {"handover_wait_seconds": 300, "owner": "me", "run_store_expire_days": 30})()
    said = []
    plan = handover.prepare(Aws_(datetime.fromtimestamp(now + 1800, timezone.utc)), settings, RUN, 120, said.append)
    assert plan is not None and plan.expires_at <= now + 1801 and plan.wanted_until >= now + 120 * 60 + 300
    assert len(said) == 1 and said[0].startswith("warning: these AWS credentials expire at")
    said.clear()
    assert handover.prepare(Aws_(None), settings, RUN, 120, said.append) is not None and said == []


def test_the_heartbeat_renews_urls_near_their_end_and_sends_them_to_the_head():
    now = time.time()
    aws = _Aws(datetime.fromtimestamp(now + 600, timezone.utc))
    plan = handover.sign(aws, aws.s3, handover.Handover(BUCKET, {}, 300, KEYS, None, now + 5 * 3600), now)
    sent, said = [], []
    renewal = handover.Renewal(aws, plan, sent.append, said.append, before_s=1200)
    assert not renewal.renew(now) and sent == []  # the same credentials' end: nothing gained, nothing sent
    aws.ends, aws.s3 = datetime.fromtimestamp(now + 3600, timezone.utc), _s3("ASIAREFRESHED")  # botocore refreshed them
    assert renewal.renew(now + 1) and len(sent) == 1
    urls = json.loads(sent[0])["urls"]
    assert set(urls) == set(KEYS) and all(_query(u)["X-Amz-Credential"].startswith("ASIAREFRESHED/") for u in urls.values())
    assert renewal.plan.expires_at == pytest.approx(now + 3600, abs=2) and said == []
    assert not renewal.renew(now + 2) and len(sent) == 1  # an hour left: more than before_s


def test_a_renewal_that_fails_is_said_once_and_tried_again():
    now = time.time()
    aws = _Aws(datetime.fromtimestamp(now + 60, timezone.utc))
    plan = handover.sign(aws, aws.s3, handover.Handover(BUCKET, {}, 300, KEYS, None, now + 3600), now)

    def expired_sso():
        raise RuntimeError("the SSO session has expired")
    aws.credentials_expire_at = expired_sso
    said, sent = [], []
    renewal = handover.Renewal(aws, plan, sent.append, said.append)
    assert not renewal.renew(now) and not renewal.renew(now + 1)
    assert len(said) == 1 and "could not be renewed" in said[0] and sent == []
    aws.credentials_expire_at = lambda: datetime.fromtimestamp(now + 3600, timezone.utc)
    assert renewal.renew(now + 2) and len(sent) == 1


def test_the_heartbeat_calls_renew_after_each_beat():
    calls = []
    beat = handover.Heartbeat(lambda: calls.append("beat"), 3.0, lambda: calls.append("renew")).start()
    time.sleep(2.5)
    beat.stop()
    assert calls[:2] == ["beat", "renew"]


def test_renewed_urls_are_written_whole_and_private(tmp_path):
    import subprocess
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    subprocess.run(["bash", "-c", handover.urls_command(str(run_dir))], input=b'{"urls": {}}', check=True)
    path = run_dir / handover.RENEWED
    assert path.read_bytes() == b'{"urls": {}}' and path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in run_dir.iterdir()) == [handover.RENEWED]  # no temporary file left
    assert handover.RENEWED == handover_urls.RENEWED


def test_a_foreground_run_role_may_write_its_own_hand_over_objects_only():
    policy = iam.handover_policy(BUCKET, USER, RUN)
    [statement] = policy["Statement"]
    assert statement["Action"] == ["s3:AbortMultipartUpload", "s3:PutObject"]
    assert statement["Resource"] == f"arn:aws:s3:::{BUCKET}/runs/{USER}/{RUN}/handover/*"
    with pytest.raises(UsageError):
        iam.handover_policy(BUCKET, "../other", RUN)


# --- the agent --------------------------------------------------------------------------------

def test_the_agent_takes_renewed_urls_for_the_same_objects_only_and_deletes_the_file(tmp_path):
    old = {"outputs": "https://b.s3.amazonaws.com/runs/u/r/handover/outputs.tar.gz?X-Amz-Signature=old",
           "record": "https://b.s3.amazonaws.com/runs/u/r/handover/agent-record.json?X-Amz-Signature=old"}
    new = {"outputs": "https://b.s3.amazonaws.com/runs/u/r/handover/outputs.tar.gz?X-Amz-Signature=new",
           "record": "https://b.s3.amazonaws.com/runs/OTHER/r/handover/agent-record.json?X-Amz-Signature=new",
           "pool": "https://b.s3.amazonaws.com/runs/u/r/handover/pool.tar.gz?X-Amz-Signature=new"}
    (tmp_path / handover_urls.RENEWED).write_text(json.dumps({"urls": new}))
    got = handover_urls.renewed(str(tmp_path), old, bounded_json.read)
    assert got == {"outputs": new["outputs"], "record": old["record"]}  # another object, a name it had not: ignored
    assert not (tmp_path / handover_urls.RENEWED).exists()
    os.symlink("/etc/passwd", tmp_path / handover_urls.RENEWED)  # a link is not followed, and goes
    assert handover_urls.renewed(str(tmp_path), old, bounded_json.read) == old
    assert not os.path.lexists(tmp_path / handover_urls.RENEWED)
    assert handover_urls.renewed(str(tmp_path), old, bounded_json.read) == old  # none
    (tmp_path / handover_urls.RENEWED).mkdir()  # a directory the job made: nothing taken, nothing raised
    assert handover_urls.renewed(str(tmp_path), old, bounded_json.read) == old


def test_the_controller_that_collects_removes_the_renewed_urls(tmp_path):
    import subprocess
    (tmp_path / handover.RENEWED).write_text("{}")
    subprocess.run(["bash", "-c", handover.mark_command(str(tmp_path), "collected")], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collected"]
    subprocess.run(["bash", "-c", handover.mark_command(str(tmp_path), "collected")], check=True)  # none: as well


def test_the_agents_signature_is_botocores():
    s3 = boto3.client("s3", region_name="eu-west-1", aws_access_key_id="ASIAROLE", aws_secret_access_key="se/cr+et",
                      aws_session_token="to/ken+=", config=botocore.config.Config(signature_version="s3v4"))
    for endpoint in (None, "http://127.0.0.1:5123"):
        if endpoint:
            s3 = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="ASIAROLE",
                              aws_secret_access_key="se/cr+et", aws_session_token="to/ken+=",
                              config=botocore.config.Config(signature_version="s3v4"))
        url = s3.generate_presigned_url("put_object", Params={"Bucket": BUCKET, "Key": f"runs/{USER}:x/{RUN}/handover/a b+.gz"},
                                        ExpiresIn=900)
        at = datetime.strptime(_query(url)["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
        mine = handover_urls.presign_put(url, {"AccessKeyId": "ASIAROLE", "SecretAccessKey": "se/cr+et", "Token": "to/ken+="},
                                         handover_urls.region_of(url), at, 900)
        assert _query(mine) == _query(url) and mine.split("?")[0] == url.split("?")[0]


class _S3:
    """A stand-in for S3: a PUT whose URL is signed with the role's key is kept by its path, any
    other is refused 400 ExpiredToken (the controller's session has ended)."""
    got: dict = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if "X-Amz-Credential=ASIAROLE" in self.path:
                _S3.got[self.path.split("?")[0]] = body
                self.send_response(200)
            else:
                self.send_response(400)
            self.end_headers()

        def log_message(self, *args):
            pass


class _Imds(http.server.BaseHTTPRequestHandler):
    role = "ec2gpu-run"

    def do_PUT(self):  # noqa: N802
        self._send(b"token")

    def do_GET(self):  # noqa: N802
        if self.headers.get("X-aws-ec2-metadata-token") != "token" or type(self).role is None:
            self.send_response(404)
            self.end_headers()
            return
        if self.path.endswith("/security-credentials/"):
            self._send(type(self).role.encode())
        else:
            self._send(json.dumps({"Code": "Success", "AccessKeyId": "ASIAROLE", "SecretAccessKey": "s",
                                   "Token": "t", "Expiration": "2099-01-01T00:00:00Z"}).encode())

    def _send(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_a_refused_url_is_signed_again_by_the_instance_role_and_the_outputs_reach_s3(tmp_path):
    s3, base = _serve(_S3.Handler)
    imds, imds_url = _serve(_Imds)
    _S3.got = {}
    urls = runstore_objects.presign_puts(_s3("ASIACONTROLLER", base), "b", KEYS, 60)
    try:
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "result.txt").write_text("42")
        agent.run(str(tmp_path), ["bash", "-c", "true"], imds_url, 0.1, 2.0, {"EC2GPU_OUTPUT_DIR": str(tmp_path / "out")},
                  None, handover={"urls": urls, "wait_s": 0.1, "shutdown": False, "secret_names": []})
        _Imds.role = None  # an instance with no role: what was refused stays refused, and the record says so
        (tmp_path / "two").mkdir()
        agent.run(str(tmp_path / "two"), ["bash", "-c", "true"], imds_url, 0.1, 2.0, {}, None,
                  handover={"urls": urls, "wait_s": 0.1, "shutdown": False, "secret_names": []})
    finally:
        _Imds.role = "ec2gpu-run"
        s3.shutdown()
        imds.shutdown()
    assert set(_S3.got) == {f"/b/{KEYS['outputs']}", f"/b/{KEYS['record']}"}
    assert json.loads(_S3.got[f"/b/{KEYS['record']}"])["handover"] == "uploaded"
    assert json.loads((tmp_path / "agent-record.json").read_text())["handover"] == "uploaded"
    assert json.loads((tmp_path / "two" / "agent-record.json").read_text())["handover"] == (
        "failed: outputs: HTTP 400, and no instance role to sign it again; record: HTTP 400, and no instance role to "
        "sign it again")


# --- the sandbox ------------------------------------------------------------------------------

def _presigned_query(key_id="ASIASESSION", signed_at=None, expires=60):
    at = signed_at or datetime.now(timezone.utc)
    return {"X-Amz-Signature": ["x"], "X-Amz-Credential": [f"{key_id}/{at:%Y%m%d}/us-east-1/s3/aws4_request"],
            "X-Amz-Date": [f"{at:%Y%m%dT%H%M%SZ}"], "X-Amz-Expires": [str(expires)]}


def test_the_sandbox_refuses_a_presigned_url_past_its_expiry_or_its_credentials_end():
    now = time.time()
    ends = {"ASIASESSION": now + 30, "ASIAENDED": now - 1}
    expiry = ends.get
    assert presigned.refusal(_presigned_query(), now, expiry) is None
    past = _presigned_query(signed_at=datetime.now(timezone.utc) - timedelta(seconds=120))
    assert presigned.refusal(past, now, expiry) == ("403 Forbidden", "AccessDenied", "Request has expired")
    assert presigned.refusal(_presigned_query("ASIAENDED", expires=3600), now, expiry)[1] == "ExpiredToken"
    assert presigned.refusal(_presigned_query("AKIAUSER", expires=3600), now, expiry) is None  # keys moto's STS did not make
    assert presigned.refusal({"Action": ["DescribeInstances"]}, now, expiry) is None  # not presigned
    other = {**_presigned_query("ASIAENDED"), "X-Amz-Credential": ["ASIAENDED/20260101/us-east-1/sts/aws4_request"]}
    assert presigned.refusal(other, now, expiry) is None  # S3's URLs only
    v2 = {"AWSAccessKeyId": ["AKIAUSER"], "Signature": ["x"], "Expires": [str(int(now) - 1)]}  # SigV2: a POSIX end
    assert presigned.refusal(v2, now, expiry) == ("403 Forbidden", "AccessDenied", "Request has expired")
    assert presigned.refusal({**v2, "Expires": [str(int(now) + 60)]}, now, expiry) is None


def test_the_sandbox_middleware_answers_an_s3_error_and_lets_the_rest_through():
    now = time.time()
    seen = []

    def app(environ, start_response):
        seen.append(environ["QUERY_STRING"])
        start_response("200 OK", [])
        return [b"moto"]
    mw = presigned.Middleware(app, now=lambda: now, expiry_of={"ASIAENDED": now - 1}.get)
    answered = []
    query = urllib.parse.urlencode({k: v[0] for k, v in _presigned_query("ASIAENDED", expires=3600).items()})
    body = b"".join(mw({"QUERY_STRING": query}, lambda status, headers: answered.append(status)))
    assert answered == ["400 Bad Request"] and b"<Code>ExpiredToken</Code>" in body and seen == []
    assert b"".join(mw({"QUERY_STRING": "list-type=2"}, lambda s, h: answered.append(s))) == b"moto"
