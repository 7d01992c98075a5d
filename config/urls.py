"""Top-level URL map: REST API under /api/, admin, and the dashboard pages."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("runs.api.urls")),
    path("", include("frontend.urls")),
]

# Unrouted /api/ URLs answer JSON like the rest of the API (an HTML page would break API clients).
handler404 = "runs.api.views.api_not_found"
