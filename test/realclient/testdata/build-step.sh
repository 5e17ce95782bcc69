#!/bin/bash
# The client side of berth's contract as the build step of the buildah-remote Tasks exercises
# it (konflux-ci/build-definitions task/buildah-remote/0.10 and
# konflux-ci/container-build-catalog task/buildah-remote), rewritten for this test: the same
# decisions on the secret, the same ssh options, rsync commands and paths on the host, and the
# same podman invocation, with the pod's paths passed in as variables. The test runs it as
# root in a mount namespace of its own whose /root is a temp dir, so ~/.ssh is never this
# machine's.
#
#   SECRET     the secret multi-platform-ssh-<taskrun> as a directory of files (the pod's /ssh)
#   WORKSPACE  the source workspace; also the working directory (the step's workingDir)
#   SHARED     the shared emptyDir (/shared);  RESULTS  the results directory (/tekton/results)
#   EMPTY      an empty directory: what the task's optional secret and ConfigMap volumes hold
#   TOOL       a file standing for the step image's /usr/bin/retry (0.10 syncs it)
#   VARIANT    0.10 or newest;  IMAGE, BUILDER_IMAGE, SOURCE_URL as the Task's env has them
#   "$@"       the step's args (--build-args ... --envs ... --labels ... --annotations ...)
set -euo pipefail

echo "prepare connection"
mkdir -p ~/.ssh
if [ -e "$SECRET/error" ]; then
	cat "$SECRET/error"
	exit 1
fi
SSH_HOST=$(cat "$SECRET/host")
IS_LOCALHOST=''
if [ "$SSH_HOST" = localhost ]; then
	IS_LOCALHOST=true
	echo "localhost: building in the pod"
elif [ -e "$SECRET/otp" ]; then
	echo "the secret has an otp, which this test does not serve" >&2
	exit 2
else
	cp "$SECRET/id_rsa" ~/.ssh
fi

mkdir -p scripts
if [ -z "$IS_LOCALHOST" ]; then
	chmod 0400 ~/.ssh/id_rsa
	BUILD_DIR=$(cat "$SECRET/user-dir")
	SSH_ARGS="-o StrictHostKeyChecking=no -o ServerAliveInterval=60 -o ServerAliveCountMax=10"
	# shellcheck disable=SC2086
	ssh $SSH_ARGS "$SSH_HOST" mkdir -p "${BUILD_DIR@Q}/workspaces" "${BUILD_DIR@Q}/scripts" "${BUILD_DIR@Q}/volumes"

	echo "rsync data"
	rsync -razW "$WORKSPACE"/ "$SSH_HOST:$BUILD_DIR/workspaces/source/"
	rsync -razW "$SHARED"/ "$SSH_HOST:$BUILD_DIR/volumes/shared/"
	for volume in etc-pki-entitlement activation-key additional-secret trusted-ca proxy-ca-bundle; do
		rsync -razW "$EMPTY"/ "$SSH_HOST:$BUILD_DIR/volumes/$volume/"
	done
	rsync -razW "$HOME/.docker/" "$SSH_HOST:$BUILD_DIR/.docker/"
	if [ "$VARIANT" = 0.10 ]; then
		rsync -razW --mkpath "$TOOL" "$SSH_HOST:$BUILD_DIR/usr/bin/retry"
	fi
	rsync -razW "$RESULTS/" "$SSH_HOST:$BUILD_DIR/results/"
fi

# The real heredoc holds the build; run locally, this one leaves what the local path reads.
cat >scripts/script-build.sh <<'EOF'
#!/bin/bash
set -euo pipefail
printf 'built in the pod' >"$RESULTS/IMAGE_URL"
EOF
chmod +x scripts/script-build.sh

if [ -z "$IS_LOCALHOST" ]; then
	ENTRYPOINT=()
	[ "$VARIANT" = 0.10 ] || ENTRYPOINT=(--entrypoint='')
	PRIVILEGED_NESTED_FLAGS=()
	RETRY_MOUNT=()
	[ "$VARIANT" != 0.10 ] || RETRY_MOUNT=(-v "${BUILD_DIR@Q}/usr/bin/retry:/usr/bin/retry:Z")
	rsync -ra scripts "$SSH_HOST:$BUILD_DIR"
	echo "build via ssh"
	# Everything after the host is one command line for the build user's shell: each value
	# is quoted with @Q, as the Task does.
	# shellcheck disable=SC2086
	ssh $SSH_ARGS "$SSH_HOST" podman run \
		--tmpfs /run/secrets \
		-e STORAGE_DRIVER="${STORAGE_DRIVER@Q}" \
		-e HERMETIC="${HERMETIC@Q}" \
		-e SOURCE_CODE_DIR="${SOURCE_CODE_DIR@Q}" \
		-e CONTEXT="${CONTEXT@Q}" \
		-e IMAGE="${IMAGE@Q}" \
		-e TLSVERIFY="${TLSVERIFY@Q}" \
		-e HOME="${HOME@Q}" \
		-e SOURCE_URL="${SOURCE_URL@Q}" \
		-e DOCKERFILE="${DOCKERFILE@Q}" \
		-e BUILDAH_HTTP_PROXY="${BUILDAH_HTTP_PROXY@Q}" \
		-v "${BUILD_DIR@Q}/workspaces/source:/workspace/source:Z" \
		-v "${BUILD_DIR@Q}/volumes/shared:/shared:Z" \
		-v "${BUILD_DIR@Q}/volumes/etc-pki-entitlement:/entitlement:Z" \
		-v "${BUILD_DIR@Q}/volumes/activation-key:/activation-key:Z" \
		-v "${BUILD_DIR@Q}/volumes/additional-secret:/additional-secret:Z" \
		-v "${BUILD_DIR@Q}/volumes/trusted-ca:/mnt/trusted-ca:Z" \
		-v "${BUILD_DIR@Q}/volumes/proxy-ca-bundle:/mnt/proxy-ca-bundle:Z" \
		-v "${BUILD_DIR@Q}/.docker/:/root/.docker:Z" \
		"${RETRY_MOUNT[@]}" \
		-v "${BUILD_DIR@Q}/results/:/tekton/results:Z" \
		-v "${BUILD_DIR@Q}/scripts:/scripts:Z" \
		-v /var/lib/containers \
		"${PRIVILEGED_NESTED_FLAGS[@]@Q}" \
		--user=0 --rm "${ENTRYPOINT[@]}" "${BUILDER_IMAGE@Q}" /scripts/script-build.sh "${@@Q}"
	echo "rsync back"
	if [ "$VARIANT" = 0.10 ]; then
		rsync -razW --stats "$SSH_HOST:$BUILD_DIR/workspaces/source/" "$WORKSPACE/"
	fi
	rsync -razW --stats "$SSH_HOST:$BUILD_DIR/volumes/shared/" "$SHARED/"
	rsync -razW --stats "$SSH_HOST:$BUILD_DIR/results/" "$RESULTS/"
else
	bash scripts/script-build.sh "$@"
fi
echo "Build on remote host $SSH_HOST finished"
