package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/berth-ci/berth/internal/taskgen"
)

func newTaskgenCommand() *cobra.Command {
	var (
		o           taskgen.Options
		output      string
		credentials bool
	)
	cmd := &cobra.Command{
		Use:   "taskgen [TASK.yaml]",
		Short: "Write the remote twin of a Tekton Task: the steps you name run on the build host berth assigns",
		Long: `taskgen reads a tekton.dev/v1 Task (the file given, or standard input) and writes its remote
twin (standard output, or --output), as buildah-remote is made from buildah. The twin:

  - is named <name>-remote (--name), and has a PLATFORM param: berth gives each TaskRun a build
    host of that platform, through the secret multi-platform-ssh-<taskrun>;
  - mounts that secret at /ssh in each rewritten step (--step, "build" by default);
  - runs each rewritten step's own script on the host, under podman, in the step's own image
    (--host-image) with its environment, args and working directory: it copies the step's
    workspaces, volumes, /tekton/results and registry credentials ($HOME/.docker, unless
    --registry-credentials=false) to the build directory there, and copies back what the step
    wrote (writable workspaces, emptyDir and similar volumes, results) when it ends. Volumes
    mounted at /var/lib/containers, and those named by --scratch, start empty on the host and
    are not copied; --host-epilogue runs after the step's script on the host (say, to write
    an image from container storage to an OCI layout in a volume that comes back), and
    --pod-epilogue in the pod once it is back (to pull it);
  - reads the secret as the real remote Tasks do: error → prints it and fails; host=localhost
    (a local platform) → runs the step's script in the pod; otp → redeems the one-time token
    at otp-server for the key; otherwise the key in id_rsa;
  - keeps every other step, param, result, comment and key order byte for byte.

The rewritten steps' image in the pod needs bash, ssh, rsync and curl: give another with
--runner-image if the step's own lacks them. The twin passes Tekton's own validation, or
taskgen says why not. See docs/taskgen.md.`,
		Example: `  berth taskgen task/buildah/0.10/buildah.yaml -o task/buildah-remote/0.10/buildah-remote.yaml
  berth taskgen buildah.yaml --host-epilogue 'buildah push "$IMAGE" "oci:/shared/image:$IMAGE"' \
    --pod-epilogue 'buildah pull "oci:/shared/image:$IMAGE"' > buildah-remote.yaml
  berth taskgen --step compile --step test --runner-image quay.io/konflux-ci/task-runner:1.6.0 < go-build.yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.KeepCredentialsInPod = !credentials
			in, from, err := readTask(cmd.InOrStdin(), args)
			if err != nil {
				return err
			}
			out, err := taskgen.Generate(in, o)
			if err != nil {
				return fmt.Errorf("%s: %w", from, err)
			}
			if output == "" || output == "-" {
				_, err := cmd.OutOrStdout().Write(out)
				return err
			}
			return os.WriteFile(output, out, 0o644)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.Steps, "step", nil, `a step to run on the build host (repeatable; default "`+taskgen.DefaultStep+`")`)
	f.StringVar(&o.Name, "name", "", "the remote Task's name (default: the Task's name with -remote)")
	f.StringVar(&o.RunnerImage, "runner-image", "", "image of the rewritten steps in the pod, with bash, ssh, rsync and curl (default: each step's own)")
	f.StringVar(&o.HostImage, "host-image", "", "image podman runs on the build host (default: each step's own)")
	f.StringArrayVar(&o.Scratch, "scratch", nil, "a volume the host gives the step empty, copied neither way (repeatable)")
	f.StringVar(&o.HostEpilogue, "host-epilogue", "", "a script to run on the host after each rewritten step succeeds, in its container (buildah: push the image to an OCI layout in /shared)")
	f.StringVar(&o.PodEpilogue, "pod-epilogue", "", "a script to run in the pod after each rewritten step succeeded on the host and its files are back (buildah: pull that layout)")
	f.BoolVar(&credentials, "registry-credentials", true, "copy the registry credentials in $HOME/.docker to the host, for the step's pulls")
	f.StringVarP(&output, "output", "o", "", "write the remote Task to this file (default: standard output)")
	return cmd
}

// readTask reads the Task from the file named in args, or from stdin; it returns the data
// and what to call its source in messages.
func readTask(stdin io.Reader, args []string) ([]byte, string, error) {
	if len(args) == 0 || args[0] == "-" {
		data, err := io.ReadAll(stdin)
		return data, "standard input", err
	}
	data, err := os.ReadFile(args[0])
	return data, args[0], err
}
