module @libtpu_fusion_crash {
  func.func public @main(%arg1030: tensor<64x32x16xf32>, %arg1038: tensor<512x64xf32>, %arg1046: tensor<16x32x64xf32>, %arg1047: tensor<16x32x64xf32>, %arg1055: tensor<512x256xf32>, %arg1057: tensor<16x32x256xf32>, %arg1058: tensor<256x64xf32>, %arg1064: tensor<512x64xf32>, %arg1073: tensor<16x4x32x32xf32>, %arg1074: tensor<16x4x32x32xi1>, %arg1075: tensor<64x64xf32>, %arg1076: tensor<512x64xf32>, %arg1078: tensor<16x32x64xf32>, %arg1081: tensor<16x32x64xf32>, %arg1082: tensor<64x256xf32>, %arg1083: tensor<512x256xf32>, %arg1084: tensor<16x32x256xf32>, %arg1085: tensor<512x64xf32>, %arg1086: tensor<16x32x64xf32>, %arg1088: tensor<16x4x32x32xf32>, %arg1089: tensor<16x32x64xf32>, %arg1090: tensor<16x4x32x32xf32>, %arg1091: tensor<f32>) -> (tensor<512x64xf32>) {
    %v145 = "stablehlo.reduce"(%arg1090, %arg1091) ({
  ^bb0(%v138: tensor<f32>, %v139: tensor<f32>):
    %v140 = "stablehlo.maximum"(%v138, %v139) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %v141 = "stablehlo.compare"(%v138, %v138) {comparison_direction = #stablehlo<comparison_direction NE>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %v142 = "stablehlo.compare"(%v139, %v139) {comparison_direction = #stablehlo<comparison_direction NE>, compare_type = #stablehlo<comparison_type FLOAT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %v143 = "stablehlo.select"(%v142, %v139, %v140) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
    %v144 = "stablehlo.select"(%v141, %v138, %v143) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
    "stablehlo.return"(%v144) : (tensor<f32>) -> ()
  }) {dimensions = array<i64: 3>} : (tensor<16x4x32x32xf32>, tensor<f32>) -> tensor<16x4x32xf32>
    %v146 = "stablehlo.reshape"(%v145) : (tensor<16x4x32xf32>) -> tensor<16x4x32x1xf32>
    %v147 = "stablehlo.reshape"(%v146) : (tensor<16x4x32x1xf32>) -> tensor<16x4x32xf32>
    %v148 = "stablehlo.broadcast_in_dim"(%v147) {broadcast_dimensions = array<i64: 0, 1, 2>} : (tensor<16x4x32xf32>) -> tensor<16x4x32x32xf32>
    %v149 = "stablehlo.subtract"(%arg1090, %v148) : (tensor<16x4x32x32xf32>, tensor<16x4x32x32xf32>) -> tensor<16x4x32x32xf32>
    %v156 = "stablehlo.exponential"(%v149) : (tensor<16x4x32x32xf32>) -> tensor<16x4x32x32xf32>
    %v160 = "stablehlo.divide"(%v156, %arg1088) : (tensor<16x4x32x32xf32>, tensor<16x4x32x32xf32>) -> tensor<16x4x32x32xf32>
    %v173 = "stablehlo.select"(%arg1074, %arg1073, %v160) : (tensor<16x4x32x32xi1>, tensor<16x4x32x32xf32>, tensor<16x4x32x32xf32>) -> tensor<16x4x32x32xf32>
    %v174 = "stablehlo.reshape"(%v173) : (tensor<16x4x32x32xf32>) -> tensor<64x32x32xf32>
    %v176 = "stablehlo.dot_general"(%v174, %arg1030) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<64x32x32xf32>, tensor<64x32x16xf32>) -> tensor<64x32x16xf32>
    %v177 = "stablehlo.reshape"(%v176) : (tensor<64x32x16xf32>) -> tensor<16x4x32x16xf32>
    %v178 = "stablehlo.transpose"(%v177) {permutation = array<i64: 0, 2, 1, 3>} : (tensor<16x4x32x16xf32>) -> tensor<16x32x4x16xf32>
    %v179 = "stablehlo.reshape"(%v178) : (tensor<16x32x4x16xf32>) -> tensor<16x32x64xf32>
    %v180 = "stablehlo.reshape"(%v179) : (tensor<16x32x64xf32>) -> tensor<512x64xf32>
    %v185 = "stablehlo.dot_general"(%v180, %arg1075) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<512x64xf32>, tensor<64x64xf32>) -> tensor<512x64xf32>
    %v188 = "stablehlo.multiply"(%v185, %arg1076) : (tensor<512x64xf32>, tensor<512x64xf32>) -> tensor<512x64xf32>
    %v198 = "stablehlo.add"(%arg1038, %v188) : (tensor<512x64xf32>, tensor<512x64xf32>) -> tensor<512x64xf32>
    %v199 = "stablehlo.reshape"(%v198) : (tensor<512x64xf32>) -> tensor<16x32x64xf32>
    %v203 = "stablehlo.multiply"(%v199, %arg1078) : (tensor<16x32x64xf32>, tensor<16x32x64xf32>) -> tensor<16x32x64xf32>
    %v204 = "stablehlo.add"(%arg1086, %v203) : (tensor<16x32x64xf32>, tensor<16x32x64xf32>) -> tensor<16x32x64xf32>
    %v215 = "stablehlo.subtract"(%v204, %arg1089) : (tensor<16x32x64xf32>, tensor<16x32x64xf32>) -> tensor<16x32x64xf32>
    %v230 = "stablehlo.multiply"(%v215, %arg1081) : (tensor<16x32x64xf32>, tensor<16x32x64xf32>) -> tensor<16x32x64xf32>
    %v232 = "stablehlo.multiply"(%v230, %arg1046) : (tensor<16x32x64xf32>, tensor<16x32x64xf32>) -> tensor<16x32x64xf32>
    %v234 = "stablehlo.add"(%v232, %arg1047) : (tensor<16x32x64xf32>, tensor<16x32x64xf32>) -> tensor<16x32x64xf32>
    %v237 = "stablehlo.reshape"(%v234) : (tensor<16x32x64xf32>) -> tensor<512x64xf32>
    %v242 = "stablehlo.dot_general"(%v237, %arg1082) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<512x64xf32>, tensor<64x256xf32>) -> tensor<512x256xf32>
    %v245 = "stablehlo.multiply"(%v242, %arg1083) : (tensor<512x256xf32>, tensor<512x256xf32>) -> tensor<512x256xf32>
    %v255 = "stablehlo.add"(%arg1055, %v245) : (tensor<512x256xf32>, tensor<512x256xf32>) -> tensor<512x256xf32>
    %v256 = "stablehlo.reshape"(%v255) : (tensor<512x256xf32>) -> tensor<16x32x256xf32>
    %v262 = "stablehlo.multiply"(%arg1084, %v256) : (tensor<16x32x256xf32>, tensor<16x32x256xf32>) -> tensor<16x32x256xf32>
    %v264 = "stablehlo.multiply"(%v262, %arg1057) : (tensor<16x32x256xf32>, tensor<16x32x256xf32>) -> tensor<16x32x256xf32>
    %v265 = "stablehlo.reshape"(%v264) : (tensor<16x32x256xf32>) -> tensor<512x256xf32>
    %v270 = "stablehlo.dot_general"(%v265, %arg1058) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [], rhs_batching_dimensions = [], lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<512x256xf32>, tensor<256x64xf32>) -> tensor<512x64xf32>
    %v273 = "stablehlo.multiply"(%v270, %arg1085) : (tensor<512x64xf32>, tensor<512x64xf32>) -> tensor<512x64xf32>
    %v283 = "stablehlo.add"(%arg1064, %v273) : (tensor<512x64xf32>, tensor<512x64xf32>) -> tensor<512x64xf32>
    "func.return"(%v283) : (tensor<512x64xf32>) -> ()
  }
}