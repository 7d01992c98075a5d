"""Django-free machinery for publishing weights under live traffic: gate, router, scheduler, channel."""
