{{/*
The groups of files/otel-numa.rules.yaml (a copy of config/prometheus/otel-numa.rules.yaml) with the values of
prometheusRule applied to every rule alike, as YAML:
- a number followed by `# parameter NAME` becomes prometheusRule.parameters.NAME; agentMemoryLimitBytes
  defaults to resources.limits.memory, and a rule that divides by it is dropped when there is no limit;
- prometheusRule.rules.<alert or record name>: enabled: false drops the rule; expr, for and keep_firing_for
  replace the file's; labels and annotations are merged over the file's;
- alerts get additionalRuleLabels and additionalRuleAnnotations under their own, and runbookBaseUrl in front
  of a relative runbook_url.
A rule name or a parameter that the file does not have is refused: it is a typo.
*/}}
{{- define "otel-numa.ruleGroups" -}}
{{- $values := .Values.prometheusRule }}
{{- $file := .Files.Get "files/otel-numa.rules.yaml" | fromYaml }}
{{- $parameters := dict }}
{{- with (.Values.resources.limits | default dict).memory }}
{{- $_ := set $parameters "agentMemoryLimitBytes" (include "otel-numa.bytes" .) }}
{{- end }}
{{- range $name, $value := $values.parameters }}
{{- $_ := set $parameters $name (include "otel-numa.number" $value) }}
{{- end }}
{{- $marker := "[ \t]*#[ \t]*parameter[ \t]+" }}
{{- $named := dict }}
{{- $found := dict }}
{{- $groups := list }}
{{- range $group := $file.groups }}
{{- $rules := list }}
{{- range $rule := $group.rules }}
{{- $name := default $rule.record $rule.alert }}
{{- $_ := set $named $name true }}
{{- $override := get ($values.rules | default dict) $name | default dict }}
{{- $expr := $rule.expr }}
{{- $drop := eq (toString (get $override "enabled")) "false" }}
{{- range $mark := regexFindAll (printf "%s[A-Za-z0-9]+" $marker) $expr -1 }}
{{- $parameter := regexReplaceAll (printf "^%s" $marker) $mark "" }}
{{- $_ := set $found $parameter true }}
{{- if hasKey $parameters $parameter }}
{{- $expr = regexReplaceAll (printf "(?m)[0-9][0-9.]*(%s%s[ \t]*)$" $marker $parameter) $expr (printf "%s${1}" (get $parameters $parameter)) }}
{{- else if eq $parameter "agentMemoryLimitBytes" }}
{{- $drop = true }}
{{- end }}
{{- end }}
{{- if not $drop }}
{{- $out := omit $rule "labels" "annotations" }}
{{- $_ := set $out "expr" (get $override "expr" | default $expr) }}
{{- range $key := list "for" "keep_firing_for" }}
{{- with get $override $key }}{{ $_ := set $out $key . }}{{ end }}
{{- end }}
{{- if $rule.alert }}
{{- $labels := merge (dict) (get $override "labels" | default dict) ($rule.labels | default dict) ($values.additionalRuleLabels | default dict) }}
{{- $annotations := merge (dict) (get $override "annotations" | default dict) ($rule.annotations | default dict) ($values.additionalRuleAnnotations | default dict) }}
{{- $runbook := get $annotations "runbook_url" | default "" }}
{{- if and $values.runbookBaseUrl $runbook (not (contains "://" $runbook)) }}
{{- $_ := set $annotations "runbook_url" (printf "%s/%s" (trimSuffix "/" $values.runbookBaseUrl) $runbook) }}
{{- end }}
{{- with $labels }}{{ $_ := set $out "labels" . }}{{ end }}
{{- with $annotations }}{{ $_ := set $out "annotations" . }}{{ end }}
{{- else }}
{{- with merge (dict) (get $override "labels" | default dict) ($rule.labels | default dict) }}{{ $_ := set $out "labels" . }}{{ end }}
{{- end }}
{{- $rules = append $rules $out }}
{{- end }}
{{- end }}
{{- if $rules }}
{{- $groups = append $groups (set (omit $group "rules") "rules" $rules) }}
{{- end }}
{{- end }}
{{- range $name, $_ := $values.rules }}
{{- if not (hasKey $named $name) }}
{{- fail (printf "prometheusRule.rules.%s: no rule of that name in otel-numa.rules.yaml (its rules: %s)" $name (keys $named | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- range $name, $_ := $values.parameters }}
{{- if not (hasKey $found $name) }}
{{- fail (printf "prometheusRule.parameters.%s: no rule of otel-numa.rules.yaml names it (its parameters: %s)" $name (keys $found | sortAlpha | join ", ")) }}
{{- end }}
{{- end }}
{{- toYaml $groups }}
{{- end }}
