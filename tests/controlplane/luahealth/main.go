// Command lua-health runs an Argo CD resource health check (health.lua)
// against fixtures, in gopher-lua, the Lua engine Argo CD embeds, set up the
// way Argo CD sets it up for a custom check from argocd-cm:
//
//   - only the package, base and table libraries are opened (no string, math
//     or io library: custom checks run with useOpenLibs false);
//   - the object is handed over as Argo CD's controller has it: decoded from
//     JSON like an apimachinery Unstructured (integers as int64, others as
//     float64), then converted to Lua values (numbers become doubles);
//   - one second of execution at most; the script must return a table whose
//     status is a valid health status (else Argo CD shows Unknown).
//
// Fixtures follow Argo CD's resource_customizations layout: a test file
//
//	tests:
//	  - inputPath: testdata/held.yaml
//	    healthStatus: {status: Healthy, message: "..."}
//
// where message may be left out (then only "not empty" is checked). Every
// result must have a non-empty message.
//
// Usage: lua-health -script health.lua -tests health_test.yaml
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/yaml"
)

type healthStatus struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

type testCase struct {
	InputPath    string       `json:"inputPath"`
	HealthStatus healthStatus `json:"healthStatus"`
	// Message checked only when set (a pointer distinguishes "" from absent).
	Message *string `json:"-"`
}

type testFile struct {
	Tests []json.RawMessage `json:"tests"`
}

var valid = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true,
	"Healthy": true, "Degraded": true, "Missing": true,
}

// decodeObject decodes JSON as apimachinery's Unstructured does: integers
// that fit int64 become int64, every other number float64.
func decodeObject(data []byte) (map[string]interface{}, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var obj map[string]interface{}
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	return convert(obj).(map[string]interface{}), nil
}

func convert(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		for k, x := range t {
			t[k] = convert(x)
		}
		return t
	case []interface{}:
		for i, x := range t {
			t[i] = convert(x)
		}
		return t
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i
		}
		f, _ := t.Float64()
		return f
	}
	return v
}

// toLua converts as Argo CD's decodeValue does (every number to LNumber).
func toLua(l *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []interface{}:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(toLua(l, item))
		}
		return arr
	case map[string]interface{}:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), toLua(l, item))
		}
		return tbl
	}
	return lua.LNil
}

func run(script string, obj map[string]interface{}) (*healthStatus, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		return nil, err
	}
	ret := l.Get(-1)
	if ret.Type() != lua.LTTable {
		return nil, fmt.Errorf("the script returned a %s, not a table", ret.Type())
	}
	encoded, err := luajson.Encode(ret)
	if err != nil {
		return nil, err
	}
	var hs healthStatus
	if err := json.Unmarshal(encoded, &hs); err != nil {
		return nil, fmt.Errorf("the returned table is not a health status: %s", encoded)
	}
	if !valid[hs.Status] {
		return nil, fmt.Errorf("invalid health status %q (Argo CD would show Unknown)", hs.Status)
	}
	return &hs, nil
}

func main() {
	scriptPath := flag.String("script", "health.lua", "the health check")
	testsPath := flag.String("tests", "health_test.yaml", "the test file (input paths relative to it)")
	flag.Parse()
	script, err := os.ReadFile(*scriptPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	raw, err := os.ReadFile(*testsPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var tf testFile
	if err := yaml.Unmarshal(raw, &tf); err != nil || len(tf.Tests) == 0 {
		fmt.Fprintf(os.Stderr, "%s: no tests (%v)\n", *testsPath, err)
		os.Exit(2)
	}
	failed := 0
	for _, rawCase := range tf.Tests {
		var tc testCase
		var probe struct {
			HealthStatus map[string]interface{} `json:"healthStatus"`
		}
		if err := json.Unmarshal(rawCase, &tc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		_ = json.Unmarshal(rawCase, &probe)
		if m, ok := probe.HealthStatus["message"].(string); ok {
			tc.Message = &m
		}
		input, err := os.ReadFile(filepath.Join(filepath.Dir(*testsPath), tc.InputPath))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		asJSON, err := yaml.YAMLToJSON(input)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", tc.InputPath, err)
			os.Exit(2)
		}
		obj, err := decodeObject(asJSON)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", tc.InputPath, err)
			os.Exit(2)
		}
		got, err := run(string(script), obj)
		var problems []string
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		default:
			if got.Status != tc.HealthStatus.Status {
				problems = append(problems, fmt.Sprintf("status %q, want %q", got.Status, tc.HealthStatus.Status))
			}
			if got.Message == "" {
				problems = append(problems, "empty message")
			}
			if tc.Message != nil && got.Message != *tc.Message {
				problems = append(problems, fmt.Sprintf("message %q, want %q", got.Message, *tc.Message))
			}
		}
		if len(problems) > 0 {
			failed++
			fmt.Printf("FAIL %s: %v\n", tc.InputPath, problems)
		} else {
			fmt.Printf("ok   %s: %s: %s\n", tc.InputPath, got.Status, got.Message)
		}
	}
	fmt.Printf("%d tests, %d failed\n", len(tf.Tests), failed)
	if failed > 0 {
		os.Exit(1)
	}
}
