"""Dashboard pages."""
urlpatterns: list = []
