package main

import (
	"debug/elf"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// The cloud SDKs' clients as bin/berth links them: each receiver with the operations berth's
// providers call, and nothing else. A provider that held a client itself, rather than the
// method values it calls (package awsec2's operations), would link every operation of it:
// over 800 of EC2's and nearly 1,900 of the VPC API's, 40% of the binary's code.
var cloudClients = map[string][]string{
	"github.com/aws/aws-sdk-go-v2/service/ec2.(*Client).": {
		"DescribeInstances", "RunInstances", "TerminateInstances",
	},
	"github.com/IBM/vpc-go-sdk/vpcv1.(*VpcV1).": {
		"CreateFloatingIPWithContext", "CreateInstanceWithContext", "DeleteFloatingIPWithContext",
		"DeleteInstanceWithContext", "GetInstanceWithContext", "ListFloatingIpsWithContext",
		"ListInstancesWithContext", "ListKeysWithContext", "ListSubnetsWithContext", "ListVpcsWithContext",
	},
}

func TestTheBinaryLinksOnlyTheCloudCallsBerthMakes(t *testing.T) {
	f, err := elf.Open(filepath.Join(binDir(t), "berth"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	symbols, err := f.Symbols()
	if err != nil {
		t.Fatalf("bin/berth's symbols: %v", err)
	}
	for receiver, want := range cloudClients {
		var linked []string
		for _, s := range symbols {
			method, ok := strings.CutPrefix(s.Name, receiver)
			// Exported methods only, without the wrappers of method values (-fm).
			if ok && method != "" && unicode.IsUpper(rune(method[0])) && !strings.Contains(method, "-") {
				linked = append(linked, method)
			}
		}
		slices.Sort(linked)
		if !slices.Equal(linked, want) {
			t.Errorf("bin/berth links %d exported methods of %s, want the %d berth calls %v; the first linked: %v",
				len(linked), strings.TrimSuffix(receiver, "."), len(want), want, linked[:min(len(linked), 8)])
		}
	}
}
