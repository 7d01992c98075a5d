"""Login and logout pages (Django's auth views with this project's templates). Login is sign-in limited
(runs.auth.auth_limit): while this username from this address, or the address, has too many recent failures the page
answers 429 with Retry-After without checking the password."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from runs.auth.auth_limit import signin_wait


class LimitedLoginView(auth_views.LoginView):
    template_name = "frontend/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args, **kwargs) -> HttpResponse:
        wait = signin_wait(request, request.POST.get("username"))
        if not wait:
            return super().post(request, *args, **kwargs)  # the backend counts a wrong password
        messages.error(request, f"Too many failed sign-ins for this username from this address. Try again in {wait} s.")
        form = self.form_class(request)  # unbound: the password is not checked
        response = self.render_to_response(self.get_context_data(form=form))
        response.status_code = 429
        response["Retry-After"] = str(wait)
        return response


login_view = LimitedLoginView.as_view()
logout_view = auth_views.LogoutView.as_view()  # POST only (Django 5): the header's log-out button is a form
