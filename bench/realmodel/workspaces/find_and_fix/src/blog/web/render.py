"""Render a post to HTML."""

from blog.text.urls import post_url


def render(title, body, year):
    url = post_url(title, year)
    return f'<article><a href="{url}">{title}</a><p>{body}</p></article>'
