"""Login and logout pages (Django's auth views with this project's templates)."""
from __future__ import annotations

from django.contrib.auth import views as auth_views

login_view = auth_views.LoginView.as_view(template_name="frontend/login.html", redirect_authenticated_user=True)
logout_view = auth_views.LogoutView.as_view()  # POST only (Django 5): the header's log-out button is a form
