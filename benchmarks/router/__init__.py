"""Sandbox Router benchmark: wrk load through the router to backends on 127.x addresses (docs/performance.md)."""
