"""Dashboard pages."""
from django.urls import path

from frontend.views import dashboard

urlpatterns: list = [
    path("", dashboard.board, name="board"),
    path("runs/new/", dashboard.run_submit_form, name="run-submit"),
    path("runs/<int:run_id>/", dashboard.run_detail, name="run-detail"),
]
