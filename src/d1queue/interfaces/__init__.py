"""How d1queue is reached: one router (router.py) serving the HTTP API
(api.py, over service.py, which RPC calls too) and the dashboard
(dashboard/), the OpenAPI document generated from the route table, and the
test kit (testing.py)."""
