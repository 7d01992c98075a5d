"""Top-level URL map: REST API under /api/, admin, and the dashboard pages."""
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("runs.api.urls")),
    path("", include("frontend.urls")),
]
