# The swarm stack's nginx front (deploy/swarm/stack.yml): Debian's nginx and the files of
# deploy/nginx/, from a Debian base (as the server's image: BASE).
#   MPS_IMAGE_DOCKERFILE=deploy/swarm/nginx.Dockerfile MPS_IMAGE_PATHS="deploy/nginx deploy/swarm" \
#     MPS_SERVER_IMAGE=mcp-python-exec-sandbox-nginx deploy/container/build.sh
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends nginx \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /etc/nginx/sites-enabled/default
COPY deploy/nginx/mcp-maps.conf deploy/nginx/mcp-location.conf deploy/nginx/mcp-proxy.conf deploy/nginx/mcp-gone.conf /etc/nginx/mcp/
COPY deploy/swarm/nginx.conf /etc/nginx/nginx.conf
RUN nginx -t -q
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
