"""OpenAPI post-processing: document the answers DRF gives before a view runs: authentication/permission
refusals on protected operations and 415 for a request body in a media type the operation does not parse."""

from __future__ import annotations

from typing import Any

ERROR_REF = {"$ref": "#/components/schemas/Error"}
AUTH_ANSWERS = {
    "401": "Not authenticated (token authentication offered).",
    "403": "Not authenticated, or not allowed (e.g. staff-only endpoints).",
}


def add_pre_view_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOKS entry: 415 on every operation with a request body; 401/403 with the
    API's error body on every operation that requires authentication (the token endpoint, which takes
    credentials in its body, has no security)."""
    if "Error" not in result.get("components", {}).get("schemas", {}):
        return result
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            if "requestBody" in operation:
                operation["responses"].setdefault(
                    "415",
                    {
                        "description": "Unsupported media type of the request body.",
                        "content": {"application/json": {"schema": ERROR_REF}},
                    },
                )
            security = operation.get("security")
            if security is not None and all(not item for item in security):
                continue  # no authentication required
            for code, text in AUTH_ANSWERS.items():
                operation["responses"].setdefault(
                    code, {"description": text, "content": {"application/json": {"schema": ERROR_REF}}}
                )
    return result
