"""REST API routes under /api/."""
urlpatterns: list = []
