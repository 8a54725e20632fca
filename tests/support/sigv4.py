"""AWS Signature Version 4 computed by hand, step by step as the AWS documentation gives it
("Create a signed AWS API request", tasks 1-3), to check botocore's signer independently."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac

#: The AWS SigV4 test suite's example credentials.
AKID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
#: The test suite's signing time, 20150830T123600Z (botocore works in naive UTC).
FROZEN = dt.datetime(2015, 8, 30, 12, 36, 0)  # noqa: DTZ001


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_by_hand(
    *,
    method: str,
    path: str,
    query: str,
    headers: dict[str, str],
    body: bytes,
    amz_date: str,
    region: str,
    service: str,
    secret: str = SECRET,
) -> tuple[str, str]:
    """(signed headers, signature) following the AWS SigV4 documentation step by step."""
    # Task 1: canonical request (headers lower-cased, trimmed, sorted; payload hash of the body).
    canon_headers = {k.lower(): " ".join(v.split()) for k, v in headers.items()}
    signed = ";".join(sorted(canon_headers))
    canonical = "\n".join(
        [
            method,
            path,
            query,
            "".join(f"{k}:{canon_headers[k]}\n" for k in sorted(canon_headers)),
            signed,
            hashlib.sha256(body).hexdigest(),
        ]
    )
    # Task 2: string to sign with the credential scope.
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    # Task 3: the signing key chain, then the signature.
    key = _hmac(
        _hmac(_hmac(_hmac(("AWS4" + secret).encode(), amz_date[:8]), region), service), "aws4_request"
    )
    return signed, hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
