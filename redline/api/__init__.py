"""The HTTP edge. One request's way (README.md, "The way of one request"):

    server.py (uvicorn) → app.py's one middleware stack (middleware.py, auth.py, limits.py)
      → hot.py: completion routes with a JSON body → openai_routes.serve
          → pipeline.prepare → (jobs_routes: 202) | pipeline.open → JSON or sse.EventStream
      → FastAPI's router: every other route (*_routes.py)

services.py builds what the routes use, once, and every route reaches it through
`services_of(request.app)`; errors.py turns every error into OpenAI's shape. A stream's
events go out through the ASGI `send` of its response (sse.EventStream: the head and a
ready first event from the request's task, the rest from one writer task, so that an
event wakes that task alone and not the middleware stack); the streams package never
sees a connection.
"""
