"""Runs schemathesis against a live `ce serve` (driven by crates/ce-cli/tests/cli/openapi.rs).

Usage: schemathesis_run.py WORKDIR SCHEMATHESIS_ARGS...

WORKDIR receives schemathesis's and Hypothesis's working files (`.schemathesis/`,
`.hypothesis/`), so the repository stays clean. The check below replaces schemathesis's
`not_a_server_error`: the server may answer 503 while an index or the embedding model is not
ready, a documented, retryable answer (`"retryable": true`, with `Retry-After`); any other
5xx is a bug.
"""

import os
import sys

import schemathesis
from schemathesis.cli import schemathesis as cli


@schemathesis.check
def no_server_error_but_a_retryable_503(ctx, response, case):
    """Fails on a 5xx answer, unless it is a 503 whose error body says `retryable: true`."""
    status = response.status_code
    if status < 500:
        return None
    if status == 503:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("retryable") is True:
            return None
    raise AssertionError(f"server error {status}: {response.text[:500]}")


if __name__ == "__main__":
    os.chdir(sys.argv[1])
    cli(args=sys.argv[2:], prog_name="schemathesis")
