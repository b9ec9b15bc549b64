"""Standard Webhooks signatures, as OpenAI signs its webhooks (and its SDK's `unwrap` checks).

The signed content is `{webhook-id}.{webhook-timestamp}.{body}`, the key the bytes after
`whsec_`, base64-decoded; `webhook-signature` is `v1,<base64 HMAC-SHA256>`, space-separated
when more than one secret is valid (during a rotation's grace period).
"""

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def secret_hint(secret: str) -> str:
    """What may be shown of a secret after its creation."""
    return f"{SECRET_PREFIX}…{secret[-4:]}"


def _signature(signing_secrets: list[str], webhook_id: str, timestamp: int, body: bytes) -> str:
    content = f"{webhook_id}.{timestamp}.".encode() + body
    return " ".join(f"v1,{_sign(secret, content)}" for secret in signing_secrets)


def _sign(secret: str, content: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    return base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()


def headers(
    signing_secrets: list[str], webhook_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three Standard Webhooks headers of one delivery attempt."""
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": _signature(signing_secrets, webhook_id, timestamp, body),
    }
