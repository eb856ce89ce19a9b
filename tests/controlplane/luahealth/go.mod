// Test-only Go module: builds lua-health, which runs contrib/argocd/health.lua
// against its fixtures in gopher-lua, the Lua engine Argo CD embeds.
module targetlease.test/controlplane/luahealth

go 1.26.0

require (
	github.com/yuin/gopher-lua v1.1.2
	layeh.com/gopher-json v0.0.0-20190114024228-97fed8db8427
	sigs.k8s.io/yaml v1.6.0
)

require go.yaml.in/yaml/v2 v2.4.2 // indirect
