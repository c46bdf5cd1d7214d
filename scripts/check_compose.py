#!/usr/bin/env python3
"""Validates docker-compose.yml against the Compose Specification's JSON schema (there is no
Docker engine on CI to run `docker compose config`), then checks what the deployment relies
on: one shared provider service, no per-replica sandbox, a /readyz healthcheck and a restart
policy on the workers, pinned images, and a build context that .dockerignore keeps small.

Usage: check_compose.py SCHEMA.json [docker-compose.yml]   (run by .ci/run)
"""
import json
import sys

import jsonschema
import yaml


def fail(msg):
    print(f"docker-compose.yml: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    schema = json.load(open(sys.argv[1]))
    path = sys.argv[2] if len(sys.argv) > 2 else "docker-compose.yml"
    doc = yaml.safe_load(open(path))
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path)
    )
    for e in errors:
        print(f"{path}: {'/'.join(map(str, e.path)) or '(top)'}: {e.message}", file=sys.stderr)
    if errors:
        sys.exit(1)

    services = doc["services"]
    for name, svc in services.items():
        image = svc.get("image", "")
        if "build" not in svc and (":" not in image or image.endswith(":latest")):
            fail(f"service {name}: image {image!r} is not pinned to a version")
        if "restart" not in svc:
            fail(f"service {name}: no restart policy")
    worker = services["claimd"]
    env = worker.get("environment", {})
    if str(env.get("CLAIMD__SANDBOX__ENABLED")).lower() != "false":
        fail("claimd replicas must not run a sandbox each (CLAIMD__SANDBOX__ENABLED: false)")
    for key in ("CLAIMD__CONSUMERS__0__EFFECT__URL", "CLAIMD__CONSUMERS__0__EFFECT__STATUS_URL"):
        if "//provider:" not in env.get(key, ""):
            fail(f"{key} must point at the shared provider service")
    if "provider" not in services:
        fail("no shared provider service")
    test = " ".join(worker.get("healthcheck", {}).get("test", []))
    if "/readyz" not in test:
        fail("the claimd healthcheck must ask /readyz")
    ignored = open(".dockerignore").read().split()
    for needed in ("/target", "*.db"):
        if needed not in ignored:
            fail(f".dockerignore must leave out {needed}")
    print(f"{path}: valid ({len(services)} services)")


if __name__ == "__main__":
    main()
